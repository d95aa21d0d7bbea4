"""The GEMV every kind streams its weights with: y = x @ w^T, bf16 operands, fp32 sums (docs/model.md §9)."""

from __future__ import annotations

import torch


def gemv_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y [R, N] fp32 for x [R, K] and w [N, K]: the products of the bf16 values summed in fp64 (exact for
    K up to thousands), then rounded once to fp32."""
    return (x.double() @ w.double().T).float()
