"""The tail as Triton bodies (docs/model.md §7): the final norm of the streams' mean, and lm_head over H's stream
rows with the norm weight folded into its weights.

The `tail` kind runs them as tasks; `final_norm` below runs the norm body as a plain launch, one program
per row, for the interpreter tests against `naive.py`. `lm_head_folded` is the gemv op's tile over H's stream
rows, their sum in stream order after it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import gemv_tile, sum_streams
from glm53ctl.kernels.tlx import interpreting, to_bf16


@triton.jit
def final_norm_row(H, norm_w, h_hat, rstd, r, eps, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    """ĥ[r] = RMSNorm(mean_j H[r, j]) * w in one pass over the row (the streams' loads all in flight at once),
    stored bf16, and its 1/RMS (what a GEMV with the norm weight folded in scales its sums by)."""
    o_d = tl.arange(0, D)
    p_h = H + r * (HC * D) + o_d
    b_h = tl.zeros((D,), dtype=tl.float32)
    for j in tl.static_range(HC):
        b_h += tl.load(p_h + j * D).to(tl.float32)
    b_h = b_h / HC
    r_std = 1.0 / tl.sqrt(tl.sum(b_h * b_h, axis=0) / D + eps)
    b_w = tl.load(norm_w + o_d).to(tl.float32)
    tl.store(h_hat + r * D + o_d, to_bf16(b_h * r_std * b_w, INTERPRET))
    tl.store(rstd + r, r_std)


@triton.jit
def lm_head_folded(
    H,
    w,
    n0,
    R,
    D: tl.constexpr,
    HC: tl.constexpr,
    N,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    M: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """sum_j H[m, j] . w'[n0 + n] for rows m < R: [M // HC, BLOCK_N] fp32. H's R * HC stream rows are the
    GEMV's rows as they are (bf16, contiguous), so nothing is computed between a load and the `tl.dot`."""
    acc = gemv_tile(H, D, w, n0, R * HC, N, D, D, BLOCK_N, BLOCK_K, INTERPRET, M)
    return sum_streams(acc, M, HC, BLOCK_N)


@triton.jit
def final_norm_kernel(H, norm_w, h_hat, rstd, eps, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    final_norm_row(H, norm_w, h_hat, rstd, tl.program_id(0), eps, D, HC, INTERPRET)


def final_norm(H: torch.Tensor, norm_w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ĥ [R, D] bf16, 1/RMS [R] fp32) for H [R, hc, D] bf16."""
    R, hc, D = H.shape
    assert H.dtype == torch.bfloat16 and H.is_contiguous()
    h_hat = torch.empty(R, D, dtype=torch.bfloat16, device=H.device)
    rstd = torch.empty(R, dtype=torch.float32, device=H.device)
    final_norm_kernel[(R,)](H, norm_w.contiguous(), h_hat, rstd, eps, D=D, HC=hc, INTERPRET=interpreting())
    return h_hat, rstd
