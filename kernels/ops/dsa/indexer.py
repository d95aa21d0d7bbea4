"""The k-pool lightning indexer as Triton bodies (docs/model.md §5.2): the key's LayerNorm, a completed pool's key,
and the index scores of a block of pools. With `select.py` (the top pools) they decide which tokens a row
attends. The `sparse` kind's tasks call them; the plain launches below run them for the tests.

The scores decide a selection that must be the reference's, so they are fp32 throughout (`tl.dot` at IEEE
precision, never TF32): qi and w from their GEMVs in fp32, the pooled keys as the cache holds them (bf16).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.tlx import interpreting, to_bf16


@triton.jit
def layer_norm_row(x, w, b, eps, N: tl.constexpr):
    """LayerNorm of one row x [N] fp32 (mean-subtracted, biased variance, weight and bias [N] bf16)."""
    o = tl.arange(0, N)
    mean = tl.sum(x, axis=0) / N
    d = x - mean
    var = tl.sum(d * d, axis=0) / N
    return d * tl.rsqrt(var + eps) * tl.load(w + o).to(tl.float32) + tl.load(b + o).to(tl.float32)


@triton.jit
def pool_key_row(keys, gates, ape, out, KP: tl.constexpr, IH: tl.constexpr, INTERPRET: tl.constexpr):
    """A completed pool's key: keys and gates [KP, IH] bf16 (its tokens' cached rows), ape [KP, IH] fp32 ->
    out [IH] bf16 = Σ_j softmax_j(gate[j, c] + ape[j, c]) · key[j, c], per channel c."""
    o_j = tl.arange(0, KP)
    o_c = tl.arange(0, IH)
    at = o_j[:, None] * IH + o_c[None, :]
    g = tl.load(gates + at).to(tl.float32) + tl.load(ape + at)
    e = tl.exp(g - tl.max(g, axis=0)[None, :])
    pk = tl.sum(e / tl.sum(e, axis=0)[None, :] * tl.load(keys + at).to(tl.float32), axis=0)
    tl.store(out + o_c, to_bf16(pk, INTERPRET))


@triton.jit
def scores_block(
    qi,
    w,
    pooled,
    scores,
    p0,
    P,
    HI: tl.constexpr,
    IH: tl.constexpr,
    BP: tl.constexpr,
    SCALE: tl.constexpr,
    INTERPRET: tl.constexpr,
    HB: tl.constexpr = 16,
):
    """I[p] for pools p0..p0 + BP (below P) of one row: qi [HI, IH] fp32, w [HI] fp32 (Hi^-0.5 applied), pooled
    [>= P, IH] bf16 -> scores [>= P] fp32. I[p] = Σ_hh w[hh] · ReLU(qi[hh] · pk[p] · SCALE). HB: the heads
    padded to a `tl.dot` tile (at least 16)."""
    o_h = tl.arange(0, HB)
    o_c = tl.arange(0, IH)
    o_p = p0 + tl.arange(0, BP)
    m_p = o_p < P
    pk = tl.load(pooled + o_p[:, None].to(tl.int64) * IH + o_c[None, :], mask=m_p[:, None], other=0.0).to(tl.float32)
    q = tl.load(qi + o_h[:, None] * IH + o_c[None, :], mask=o_h[:, None] < HI, other=0.0)
    if INTERPRET:
        s = tl.dot(q.to(tl.float64), tl.trans(pk.to(tl.float64))).to(tl.float32)
    else:
        s = tl.dot(q, tl.trans(pk), input_precision="ieee")
    s = tl.maximum(s * SCALE, 0.0)  # [HI, BP]
    tl.store(scores + o_p, tl.sum(tl.load(w + o_h, mask=o_h < HI, other=0.0)[:, None] * s, axis=0), mask=m_p)


# ---- plain launches of the bodies (tests; the kind runs them as tasks)


@triton.jit
def _scores_kernel(
    qi,
    w,
    pooled,
    scores,
    P,
    stride_pk,
    stride_s,
    HI: tl.constexpr,
    IH: tl.constexpr,
    BP: tl.constexpr,
    SCALE: tl.constexpr,
    INTERPRET: tl.constexpr,
    HB: tl.constexpr,
):
    """Program (pool block, row)."""
    r = tl.program_id(1)
    scores_block(
        qi + r * HI * IH,
        w + r * HI,
        pooled + r * stride_pk,
        scores + r * stride_s,
        tl.program_id(0) * BP,
        tl.load(P + r),
        HI,
        IH,
        BP,
        SCALE,
        INTERPRET,
        HB,
    )


@triton.jit
def _pool_kernel(keys, gates, ape, out, KP: tl.constexpr, IH: tl.constexpr, INTERPRET: tl.constexpr):
    """Program i: pool i of keys and gates [N, KP, IH]."""
    i = tl.program_id(0)
    pool_key_row(keys + i * KP * IH, gates + i * KP * IH, ape, out + i * IH, KP, IH, INTERPRET)


def scores_launch(qi: torch.Tensor, w: torch.Tensor, pooled: torch.Tensor, P: torch.Tensor, spec, block: int = 64):
    """I [R, max P] fp32 (a row's pools past its P left at 0) of qi [R, Hi, ih] and w [R, Hi] fp32, pooled [R, >=
    max P, ih] bf16 and P [R] complete pools per row, as the reference's `index_scores`."""
    return scores_runner(qi, w, pooled, P, spec, block)()


def scores_runner(
    qi: torch.Tensor, w: torch.Tensor, pooled: torch.Tensor, P: torch.Tensor, spec, block: int = 64
) -> Callable[[], torch.Tensor]:
    """`scores_launch` made once (its scores zeroed once; a launch writes each row's first P) and launched at each
    call into the same buffers, returning the scores: what `bench --op scores` times in a CUDA graph."""
    R, HI, IH = qi.shape
    Pmax = int(P.max())
    scores = torch.zeros(R, max(Pmax, 1), dtype=torch.float32, device=qi.device)
    pk = pooled.to(torch.bfloat16).contiguous()
    q, wf, pp = qi.float().contiguous(), w.float().contiguous(), P.to(torch.int32).to(qi.device)
    consts = dict(HI=HI, IH=IH, BP=block, SCALE=spec.indexer.head_dim**-0.5, INTERPRET=interpreting(), HB=max(16, HI))

    def run() -> torch.Tensor:
        grid = (triton.cdiv(max(Pmax, 1), block), R)
        _scores_kernel[grid](q, wf, pk, scores, pp, pk.stride(0), scores.stride(0), **consts)
        return scores

    return run


@triton.jit
def _ln_kernel(x, w, b, out, eps, N: tl.constexpr):
    r = tl.program_id(0)
    o = tl.arange(0, N)
    tl.store(out + r * N + o, layer_norm_row(tl.load(x + r * N + o), w, b, eps, N))


def layer_norm_launch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of each row of x [R, N] fp32 with weight and bias [N] (bf16), as F.layer_norm."""
    out = torch.empty_like(x, dtype=torch.float32)
    wb = [t.to(torch.bfloat16).contiguous() for t in (w, b)]
    _ln_kernel[(x.shape[0],)](x.float().contiguous(), *wb, out, eps, N=x.shape[1])
    return out


def pool_launch(keys: torch.Tensor, gates: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """Pooled keys [N, ih] bf16 of keys and gates [N, kpool, ih] bf16 and ape [kpool, ih], as `pool_key`."""
    N, KP, IH = keys.shape
    out = torch.empty(N, IH, dtype=torch.bfloat16, device=keys.device)
    _pool_kernel[(N,)](
        keys.to(torch.bfloat16).contiguous(),
        gates.to(torch.bfloat16).contiguous(),
        ape.float().contiguous(),
        out,
        KP=KP,
        IH=IH,
        INTERPRET=interpreting(),
    )
    return out
