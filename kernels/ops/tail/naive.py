"""The tail (docs/model.md §7): mean of the streams (trap 11: no learned head), final RMSNorm, vocab-parallel
lm_head."""

from __future__ import annotations

import torch

from glm53ctl.kernels.numerics import Numerics, linear, rms_norm


def final_norm(H: torch.Tensor, norm_weight: torch.Tensor, eps: float, num: Numerics) -> torch.Tensor:
    """ĥ [R, D]: the normalized mean row that every rank's lm_head shard reads (bf16 hand-off)."""
    h = num.c(H).mean(dim=1)
    return num.store(rms_norm(h, num.c(norm_weight), eps))


def logits_shard(h_hat: torch.Tensor, lm_head: torch.Tensor, num: Numerics) -> torch.Tensor:
    """This rank's logits [R, V/T] (fp32 out); the launch gathers all ranks' shards."""
    return linear(num.c(h_hat), lm_head)
