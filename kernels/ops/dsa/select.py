"""The indexer's selection as a Triton body (docs/model.md §5.2, kernels/ops/dsa/README.md "Selection"): exact and
deterministic at any context, one program per row, nothing that depends on timing. The `sparse` kind's tasks
call it; `select_launch` runs it as a plain launch for the tests.

A row with n cached tokens has P = n // kpool complete pools, each with an index score. Its selected tokens are
the first `TOPP` pools by score descending, ties by pool index ascending (the reference's stable sort), listed
by pool index ascending and expanded to their tokens, then the tail kpool·P .. n-1, then -1 up to the width.

While P <= TOPP every pool is taken. Past it, the TOPP-th largest score is found by a radix select over the
scores' bits: a score's float order as an unsigned 32-bit key (-0.0 as +0.0, which the reference's comparisons
do not tell apart), four passes of 8 bits, each a histogram of the digit of the keys whose higher bits match the
digits found so far. Then the pools above that key are taken, and of those equal to it the lowest-indexed, as
many as are left. Each pass streams the row's scores in blocks of BLOCK: a 128K context (32,768 pools) is 8
blocks of 4096 a pass, 5 passes in all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels import tlx  # noqa: F401 - the interpreter's settings before any kernel is defined


@triton.jit
def score_key(s):
    """A score's order as an unsigned 32-bit key: a larger score has a larger key; -0.0 is +0.0."""
    s = tl.where(s == 0.0, 0.0, s)
    b = s.to(tl.int32, bitcast=True)
    # negative: every bit flipped (a more negative score, a smaller key); positive: the sign bit set
    return (b ^ ((b >> 31) | -(2**31))).to(tl.uint32, bitcast=True)


@triton.jit
def _digit_counts(scores, P, prefix, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """Per digit d [256]: the pools whose key has digit d at SHIFT and whose bits above it equal prefix's."""
    counts = tl.zeros((256,), dtype=tl.int32)
    o_b = tl.arange(0, BLOCK)
    for p0 in range(0, P, BLOCK):
        o_p = p0 + o_b
        key = score_key(tl.load(scores + o_p, mask=o_p < P, other=0.0))
        match = o_p < P
        if SHIFT < 24:  # the digits found so far: the bits above this one
            match = match & ((key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        counts += tl.histogram(((key >> SHIFT) & 255).to(tl.int32), 256, mask=match).to(tl.int32)
    return counts


@triton.jit
def select_row(scores, idx, n, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """The row's selected tokens into idx [WIDTH] int32, from its pools' scores [>= P] fp32 (n cached tokens).
    WIDTH: TOPP * KP + KP - 1, the most a row selects."""
    P = n // KP
    o_b = tl.arange(0, BLOCK)
    o_d = tl.arange(0, 256)
    # the threshold key: the TOPP-th largest; `left`: how many pools with exactly that key are taken
    prefix = tl.zeros((), dtype=tl.uint32)
    left = TOPP + 0 * P
    if P > TOPP:
        for i in tl.static_range(4):
            counts = _digit_counts(scores, P, prefix, 24 - 8 * i, BLOCK)
            # the pools with a larger digit, per digit: the threshold's digit is the largest whose count of pools
            # at or above it reaches `left`
            above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0)
            d = tl.max(tl.where(above + counts >= left, o_d, -1), axis=0)
            left -= tl.sum(tl.where(o_d > d, counts, 0), axis=0)
            prefix = prefix | (d.to(tl.uint32) << (24 - 8 * i))
    # the pools taken, in pool order: every pool while P <= TOPP; else those above the threshold, and of those at
    # it the first `left`
    taken = 0 * P
    at = 0 * P
    for p0 in range(0, P, BLOCK):
        o_p = p0 + o_b
        m = o_p < P
        key = score_key(tl.load(scores + o_p, mask=m, other=0.0))
        eq = m & (key == prefix)
        take = m & ((key > prefix) | (eq & (at + tl.cumsum(eq.to(tl.int32), axis=0) <= left)) | (P <= TOPP))
        slot = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        for j in tl.static_range(KP):
            tl.store(idx + slot * KP + j, o_p * KP + j, mask=take)
        taken += tl.sum(take.to(tl.int32), axis=0)
        at += tl.sum(eq.to(tl.int32), axis=0)
    # then the tail (the tokens of the pool not yet complete), then -1 up to WIDTH
    o_k = tl.arange(0, KP)
    first = taken * KP
    tl.store(idx + first + o_k, P * KP + o_k, mask=o_k < n - P * KP)
    for w0 in range(0, WIDTH, BLOCK):
        o_w = w0 + o_b
        tl.store(idx + o_w, -1, mask=(o_w >= first + n - P * KP) & (o_w < WIDTH))


@triton.jit
def _select_kernel(
    scores, idx, n, stride, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr
):
    """Program r: row r."""
    r = tl.program_id(0)
    select_row(scores + r * stride, idx + r * WIDTH, tl.load(n + r), KP, TOPP, WIDTH, BLOCK)


def select_launch(scores: torch.Tensor, n: torch.Tensor, spec, block: int = 4096) -> torch.Tensor:
    """Every row's selected tokens: scores [R, >= max P] fp32 (a row's pools past its P unread), n [R] cached
    tokens -> idx [R, index_width] int32, as the reference's `select_token_rows`."""
    R = scores.shape[0]
    ix = spec.indexer
    idx = torch.empty(R, spec.index_width, dtype=torch.int32, device=scores.device)
    s = scores.float().contiguous()
    nn = n.to(torch.int32).to(scores.device).contiguous()
    _select_kernel[(R,)](
        s, idx, nn, s.stride(0), KP=ix.kpool, TOPP=spec.index_pools, WIDTH=spec.index_width, BLOCK=block
    )
    return idx
