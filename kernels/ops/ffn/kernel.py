"""The clamped-SwiGLU activation as a Triton body (docs/model.md §6.1): act = silu(min(gate, L)) * clamp(up, -L, L)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.tlx import interpreting, to_bf16


@triton.jit
def swiglu_act(g, u, LIMIT: tl.constexpr):
    """silu(min(g, L)) * clamp(u, -L, L) in fp32, elementwise."""
    g = tl.minimum(g, LIMIT)
    u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
    return g * tl.sigmoid(g) * u


@triton.jit
def swiglu_kernel(gu, act, I: tl.constexpr, LIMIT: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """Row program_id(0): gu [R, 2I] fp32 (gate | up) -> act [R, I] bf16, what the down projection reads."""
    r = tl.program_id(0)
    for c0 in range(0, I, BLOCK):
        o = c0 + tl.arange(0, BLOCK)
        b_act = swiglu_act(tl.load(gu + r * (2 * I) + o), tl.load(gu + r * (2 * I) + I + o), LIMIT)
        tl.store(act + r * I + o, to_bf16(b_act, INTERPRET))


def swiglu(gu: torch.Tensor, limit: float) -> torch.Tensor:
    R, two_i = gu.shape
    inter = two_i // 2
    act = torch.empty(R, inter, dtype=torch.bfloat16, device=gu.device)
    swiglu_kernel[(R,)](
        gu.float().contiguous(),
        act,
        I=inter,
        LIMIT=limit,
        BLOCK=min(inter, 1024),
        INTERPRET=interpreting(),
    )
    return act
