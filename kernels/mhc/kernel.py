"""mHC task bodies in Triton: the gate (hc_pre with Sinkhorn, then the RMSNorm) and hc_post, one row each.

They are the bodies the layer launches will run as tasks (issue 7). `gate` and `hc_post` below run them as
plain launches, one program per row: how the interpreter tests check them against `naive.py`, and the
separate-launches baseline a persistent layer launch must beat.
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
def gate_row(
    H,
    fn,
    base,
    scale,
    norm_w,
    x_hat,
    post,
    comb,
    r,
    hc_eps,
    norm_eps,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Row r: x̂ [D] bf16, post [HC] and comb [HC, HC] fp32 (SPEC.md §3; C[i, j] from mix[2HC + HC*i + j])."""
    NMIX: tl.constexpr = (2 + HC) * HC
    p_h = H + r * (HC * D)
    o_d = tl.arange(0, D)
    # unweighted RMSNorm over all streams: its scale first, then mix = fn @ f chunk by chunk
    ss = 0.0
    for j in tl.static_range(HC):
        b_h = tl.load(p_h + j * D + o_d).to(tl.float32)
        ss += tl.sum(b_h * b_h, axis=0)
    rs = 1.0 / tl.sqrt(ss / (HC * D) + norm_eps)
    o_m = tl.arange(0, 32)  # NMIX = 24 mixing rows, padded to 32
    m_m = o_m < NMIX
    mix = tl.zeros((32,), dtype=tl.float32)
    for j in tl.static_range(HC):
        for d0 in range(0, D, BLOCK_D):
            o_k = d0 + tl.arange(0, BLOCK_D)
            b_f = tl.load(p_h + j * D + o_k).to(tl.float32) * rs
            b_fn = tl.load(fn + o_m[:, None] * (HC * D) + j * D + o_k[None, :], mask=m_m[:, None], other=0.0)
            mix += tl.sum(b_fn * b_f[None, :], axis=1)
    gate_finish(mix, p_h, base, scale, norm_w, x_hat, post, comb, r, hc_eps, norm_eps, D, HC, ITERS, INTERPRET)


@triton.jit
def gate_finish(
    mix,
    p_h,
    base,
    scale,
    norm_w,
    x_hat,
    post,
    comb,
    r,
    hc_eps,
    norm_eps,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """The gate of row r from its mix logits (fn @ f, padded to 32) and its streams at p_h [HC, D]: pre, post,
    the Sinkhorn comb, x = sum_j pre[j] H[j], then the RMSNorm. Stores x̂[r], post[r] and comb[r]; returns
    pre [HC] and the RMSNorm's 1/RMS (for a GEMV that folds the norm into its weights)."""
    gate_comb(mix, base, scale, comb, r, hc_eps, HC, ITERS)
    return gate_pre(mix, p_h, base, scale, norm_w, x_hat, post, r, hc_eps, norm_eps, D, HC, INTERPRET)


@triton.jit
def gate_pre(
    mix,
    p_h,
    base,
    scale,
    norm_w,
    x_hat,
    post,
    r,
    hc_eps,
    norm_eps,
    D: tl.constexpr,
    HC: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """gate_finish without the comb: pre, post, x = sum_j pre[j] H[j] and its RMSNorm. Stores x̂[r] and post[r];
    returns pre [HC] and 1/RMS. What the GEMV after the gate needs; the Sinkhorn is for hc_post, much later."""
    o_m = tl.arange(0, 32)
    o_c = tl.arange(0, HC)
    o_d = tl.arange(0, D)
    b_pre = tl.sigmoid(_pick(mix, o_m, o_c) * tl.load(scale) + tl.load(base + o_c)) + hc_eps
    b_post = 2.0 * tl.sigmoid(_pick(mix, o_m, HC + o_c) * tl.load(scale + 1) + tl.load(base + HC + o_c))
    # x = sum_j pre[j] H[j], then the gate's RMSNorm
    x = tl.zeros((D,), dtype=tl.float32)
    for j in tl.static_range(HC):
        x += tl.sum(tl.where(o_c == j, b_pre, 0.0), axis=0) * tl.load(p_h + j * D + o_d).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + norm_eps)
    b_w = tl.load(norm_w + o_d).to(tl.float32)
    tl.store(x_hat + r * D + o_d, to_bf16(x * rstd * b_w, INTERPRET))
    tl.store(post + r * HC + o_c, b_post)
    return b_pre, rstd


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
def hc_post_row(a, H, post, comb, H_out, r, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    """Row r: H_out[j] = post[j] * a + sum_i C[i, j] H[i] (C transposed, SPEC.md §3), stored bf16."""
    o_d = tl.arange(0, D)
    b_a = tl.load(a + r * D + o_d).to(tl.float32)
    for j in tl.static_range(HC):
        acc = tl.load(post + r * HC + j) * b_a
        for i in tl.static_range(HC):
            acc += tl.load(comb + r * (HC * HC) + i * HC + j) * tl.load(H + (r * HC + i) * D + o_d).to(tl.float32)
        tl.store(H_out + (r * HC + j) * D + o_d, to_bf16(acc, INTERPRET))


@triton.jit
def gate_kernel(
    H,
    fn,
    base,
    scale,
    norm_w,
    x_hat,
    post,
    comb,
    hc_eps,
    norm_eps,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    gate_row(
        H,
        fn,
        base,
        scale,
        norm_w,
        x_hat,
        post,
        comb,
        tl.program_id(0),
        hc_eps,
        norm_eps,
        D,
        HC,
        ITERS,
        BLOCK_D,
        INTERPRET,
    )


@triton.jit
def hc_post_kernel(a, H, post, comb, H_out, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    hc_post_row(a, H, post, comb, H_out, tl.program_id(0), D, HC, INTERPRET)


def gate(H, fn, base, scale, norm_w, spec):
    """x̂ [R, D] bf16, post [R, hc] and comb [R, hc, hc] fp32 for H [R, hc, D] bf16: one program per row."""
    R, hc, D = H.shape
    assert H.dtype == torch.bfloat16 and H.is_contiguous() and hc == spec.mhc.streams == 4
    assert fn.shape == ((2 + hc) * hc, hc * D) and fn.dtype == torch.float32 and fn.is_contiguous()
    x_hat = torch.empty(R, D, dtype=torch.bfloat16, device=H.device)
    post = torch.empty(R, hc, dtype=torch.float32, device=H.device)
    comb = torch.empty(R, hc, hc, dtype=torch.float32, device=H.device)
    gate_kernel[(R,)](
        H,
        fn,
        base,
        scale,
        norm_w,
        x_hat,
        post,
        comb,
        spec.mhc.eps,
        spec.model.rms_norm_eps,
        D=D,
        HC=hc,
        ITERS=spec.mhc.sinkhorn_iters,
        BLOCK_D=min(D, 256),
        INTERPRET=interpreting(),
    )
    return x_hat, post, comb


def hc_post(a, H, post, comb):
    """H_out [R, hc, D] bf16 from a [R, D], H [R, hc, D] bf16, post [R, hc], comb [R, hc, hc]."""
    R, hc, D = H.shape
    assert a.shape == (R, D) and H.dtype == torch.bfloat16 and H.is_contiguous()
    H_out = torch.empty_like(H)
    hc_post_kernel[(R,)](
        a.contiguous(), H, post.contiguous(), comb.contiguous(), H_out, D=D, HC=hc, INTERPRET=interpreting()
    )
    return H_out
