"""mHC as Triton bodies (docs/model.md §3): the gate (mix logits, hc_pre with Sinkhorn, the RMSNorm) and hc_post.

The layer kinds run these bodies as tasks over column chunks of a row: `mix_row` per chunk (the mix logits,
the sum of squares and the streams' Gram matrix), then per chunk again `gate_scale` and `gate_pre` over the
chunks' sums and `gate_x_hat` of the chunk (no program makes a whole row), and `gate_comb` (the Sinkhorn, for
hc_post) as a task of its own; `hc_post_cols` per chunk. `gate` and `hc_post` below run the very same bodies
as plain launches, one program per row: how the interpreter tests check them against `naive.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.tlx import interpreting, to_bf16


@triton.jit
def _pick(v, o_v, idx):
    """v[idx] for an index tensor idx (a gather from a small register vector by masked sums)."""
    return tl.sum(tl.where(o_v[None, :] == idx[:, None], v[None, :], 0.0), axis=1)


@triton.jit
def mix_row(H, fn, r, o_c, D: tl.constexpr, HC: tl.constexpr):
    """Row r's gate mix logits [32] (fn @ H, NMIX rows padded to 32), the streams' Gram matrix [HC, HC]
    (G[i, j] = H_i · H_j) and its trace, the sum of squares, over columns o_c. Every load goes out before the
    first sum, whose cross-warp step is a barrier that later loads would wait behind: one round trip to L2, not
    HC. The Gram matrix gives the gate's RMS without a pass over the row (`gate_pre`)."""
    NMIX: tl.constexpr = (2 + HC) * HC
    o_m = tl.arange(0, 32)
    o_j = tl.arange(0, HC)
    b_hs = ()
    b_fns = ()
    for j in tl.static_range(HC):
        b_hs = b_hs + (tl.load(H + (r * HC + j) * D + o_c).to(tl.float32),)
        p_fn = fn + o_m[:, None] * (HC * D) + j * D + o_c[None, :]
        b_fns = b_fns + (tl.load(p_fn, mask=o_m[:, None] < NMIX, other=0.0),)
    b_h = tl.load(H + (r * HC + o_j[:, None]) * D + o_c[None, :]).to(tl.float32)
    # the streams' products summed before one reduction each: two cross-warp steps in all (mix, Gram)
    prod = b_fns[0] * b_hs[0][None, :]
    for j in tl.static_range(1, HC):
        prod += b_fns[j] * b_hs[j][None, :]
    mix = tl.sum(prod, axis=1)
    gram = tl.sum(b_h[:, None, :] * b_h[None, :, :], axis=2)
    ss = tl.sum(tl.sum(tl.where(o_j[:, None] == o_j[None, :], gram, 0.0), axis=1), axis=0)
    return mix, ss, gram


@triton.jit
def gate_scale(mix, ss, norm_eps, D: tl.constexpr, HC: tl.constexpr):
    """The mix logits of the normalized streams from the row's sums over all chunks: fn @ (H / rms(H)) =
    (fn @ H) / rms(H), the unweighted RMSNorm over all streams applied once."""
    return mix * (1.0 / tl.sqrt(ss / (HC * D) + norm_eps))


@triton.jit
def gate_pre(mix, gram, base, scale, hc_eps, norm_eps, D: tl.constexpr, HC: tl.constexpr):
    """gate_finish without the comb and without a pass over the row: pre [HC], post [HC] and the RMSNorm's 1/RMS
    of x = sum_j pre[j] H[j], from the mix logits and the streams' Gram matrix G summed over the row's chunks:
    x · x = preᵀ G pre. What the GEMV after the gate needs (a folded one reads nothing else); x̂ itself is
    `gate_x_hat`'s, chunk by chunk; the Sinkhorn is for hc_post, much later."""
    o_m = tl.arange(0, 32)
    o_c = tl.arange(0, HC)
    b_pre = tl.sigmoid(_pick(mix, o_m, o_c) * tl.load(scale) + tl.load(base + o_c)) + hc_eps
    b_post = 2.0 * tl.sigmoid(_pick(mix, o_m, HC + o_c) * tl.load(scale + 1) + tl.load(base + HC + o_c))
    xx = tl.sum(tl.sum(b_pre[:, None] * gram * b_pre[None, :], axis=1), axis=0)
    rstd = 1.0 / tl.sqrt(xx / D + norm_eps)
    return b_pre, b_post, rstd


@triton.jit
def gate_x_hat(p_h, b_pre, rstd, norm_w, x_hat, r, o_d, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    """x̂[r] over columns o_d: x = sum_j pre[j] H[j] (p_h: row r's streams), times 1/RMS and the norm's weight,
    stored bf16. A column's bits do not depend on how the columns are split."""
    o_c = tl.arange(0, HC)
    x = tl.zeros(o_d.shape, dtype=tl.float32)
    for j in tl.static_range(HC):
        x += tl.sum(tl.where(o_c == j, b_pre, 0.0), axis=0) * tl.load(p_h + j * D + o_d).to(tl.float32)
    b_w = tl.load(norm_w + o_d).to(tl.float32)
    tl.store(x_hat + r * D + o_d, to_bf16(x * rstd * b_w, INTERPRET))


@triton.jit
def gate_comb(mix, base, scale, comb, r, hc_eps, HC: tl.constexpr, ITERS: tl.constexpr):
    """The gate's comb [HC, HC] of row r from its mix logits: row softmax, column normalisation, and ITERS - 1
    (row, column) rounds (Sinkhorn). Its column sums cross warps: a barrier a round, several µs in all."""
    o_m = tl.arange(0, 32)
    o_c = tl.arange(0, HC)
    idx = 2 * HC + o_c[:, None] * HC + o_c[None, :]
    s2 = tl.load(scale + 2)
    logits = tl.sum(tl.where(o_m[None, None, :] == idx[:, :, None], mix[None, None, :], 0.0), axis=2) * s2
    logits += tl.load(base + idx)
    e = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    c = e / tl.sum(e, axis=1)[:, None] + hc_eps
    c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    for _ in range(ITERS - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + hc_eps)
        c = c / (tl.sum(c, axis=0)[None, :] + hc_eps)
    tl.store(comb + r * (HC * HC) + idx - 2 * HC, c)


@triton.jit
def hc_post_cols(a, H, post, comb, H_out, r, o_c, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    """Row r over columns o_c: H_out[j] = post[j] * a + sum_i C[i, j] H[i] (C transposed, docs/model.md §3), stored
    bf16; a: the layer's output over o_c (fp32, in registers)."""
    for j in tl.static_range(HC):
        acc = tl.load(post + r * HC + j) * a
        for i in tl.static_range(HC):
            acc += tl.load(comb + r * (HC * HC) + i * HC + j) * tl.load(H + (r * HC + i) * D + o_c).to(tl.float32)
        tl.store(H_out + (r * HC + j) * D + o_c, to_bf16(acc, INTERPRET))


@triton.jit
def gate_kernel(
    H, fn, base, scale, norm_w, x_hat, post, comb, hc_eps, norm_eps, D: tl.constexpr, HC: tl.constexpr,
    ITERS: tl.constexpr, CH: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """Row program_id(0)'s gate, chunk by chunk as the layer kinds' tasks make it (the same sums in the same
    order)."""
    r = tl.program_id(0)
    o_j = tl.arange(0, HC)
    mix = tl.zeros((32,), dtype=tl.float32)
    ss = 0.0
    gram = tl.zeros((HC, HC), dtype=tl.float32)
    for c in tl.static_range(D // CH):
        m, s, g = mix_row(H, fn, r, c * CH + tl.arange(0, CH), D, HC)
        mix += m
        ss += s
        gram += g
    mix = gate_scale(mix, ss, norm_eps, D, HC)
    gate_comb(mix, base, scale, comb, r, hc_eps, HC, ITERS)
    b_pre, b_post, rstd = gate_pre(mix, gram, base, scale, hc_eps, norm_eps, D, HC)
    tl.store(post + r * HC + o_j, b_post)
    for c in tl.static_range(D // CH):
        gate_x_hat(H + r * (HC * D), b_pre, rstd, norm_w, x_hat, r, c * CH + tl.arange(0, CH), D, HC, INTERPRET)


@triton.jit
def hc_post_kernel(
    a, H, post, comb, H_out, D: tl.constexpr, HC: tl.constexpr, CH: tl.constexpr, INTERPRET: tl.constexpr
):
    r = tl.program_id(0)
    for c in tl.static_range(D // CH):
        o_c = c * CH + tl.arange(0, CH)
        hc_post_cols(tl.load(a + r * D + o_c).to(tl.float32), H, post, comb, H_out, r, o_c, D, HC, INTERPRET)


def gate(H, fn, base, scale, norm_w, spec, chunk: int = 128):
    """x̂ [R, D] bf16, post [R, hc] and comb [R, hc, hc] fp32 for H [R, hc, D] bf16: one program per row, the
    mix logits summed over column chunks of `chunk` (the layer kinds' knob chunk_cols)."""
    R, hc, D = H.shape
    assert H.dtype == torch.bfloat16 and H.is_contiguous() and hc == spec.mhc.streams == 4
    assert D % min(chunk, D) == 0, "the mix logits are summed over whole chunks"
    assert fn.shape == ((2 + hc) * hc, hc * D) and fn.dtype == torch.float32 and fn.is_contiguous()
    x_hat = torch.empty(R, D, dtype=torch.bfloat16, device=H.device)
    post = torch.empty(R, hc, dtype=torch.float32, device=H.device)
    comb = torch.empty(R, hc, hc, dtype=torch.float32, device=H.device)
    gate_kernel[(R,)](
        H, fn, base, scale, norm_w, x_hat, post, comb, spec.mhc.eps, spec.model.rms_norm_eps, D=D, HC=hc,
        ITERS=spec.mhc.sinkhorn_iters, CH=min(chunk, D), INTERPRET=interpreting(),
    )  # fmt: skip
    return x_hat, post, comb


def hc_post(a, H, post, comb, chunk: int = 128):
    """H_out [R, hc, D] bf16 from a [R, D], H [R, hc, D] bf16, post [R, hc], comb [R, hc, hc]."""
    R, hc, D = H.shape
    assert a.shape == (R, D) and H.dtype == torch.bfloat16 and H.is_contiguous()
    assert D % min(chunk, D) == 0, "hc_post runs over whole chunks"
    H_out = torch.empty_like(H)
    hc_post_kernel[(R,)](
        a.contiguous(),
        H,
        post.contiguous(),
        comb.contiguous(),
        H_out,
        D=D,
        HC=hc,
        CH=min(chunk, D),
        INTERPRET=interpreting(),
    )
    return H_out
