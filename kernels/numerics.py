"""How the PyTorch reference computes: the compute dtype, and which dtype stored tensors are rounded to.

Ground truth (docs/model.md §11): bf16/fp32 weights upcast, every op in fp32, and every tensor that the
kernels store in bf16 (H, caches, the conv state) rounded to bf16 where it is stored. `FP64` keeps
everything exact: TP-vs-TP1 and decode-vs-prefill compare in it with a tight tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Numerics:
    dtype: torch.dtype = torch.float32
    # None: stored tensors keep the compute dtype (exact checks)
    store_dtype: torch.dtype | None = torch.bfloat16

    def c(self, x: torch.Tensor) -> torch.Tensor:
        """A tensor in the compute dtype."""
        return x.to(self.dtype)

    def store(self, x: torch.Tensor) -> torch.Tensor:
        """A value as it reads back after a bf16 store (compute dtype kept)."""
        x = x.to(self.dtype)
        return x if self.store_dtype is None else x.to(self.store_dtype).to(self.dtype)


FP32 = Numerics()
FP64 = Numerics(torch.float64, None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim; weight None is the unweighted form (mHC's input norm)."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight.to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ w[out, in]^T in x's dtype (w upcast)."""
    return x @ w.to(x.dtype).t()


def rel_rms(ref: torch.Tensor, out: torch.Tensor) -> float:
    """RMS(out - ref) / RMS(ref), in fp64 on the CPU; any NaN in `out` is infinitely wrong."""
    if torch.isnan(out).any():
        return float("inf")
    ref, out = ref.double().cpu(), out.double().cpu()
    return float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-300))


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit pattern as integers of its width: compared, -0.0 != +0.0 and two NaNs with the same
    bits are equal (what "bitwise equal" means everywhere in glm53ctl)."""
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() else t
