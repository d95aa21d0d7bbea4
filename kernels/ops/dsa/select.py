"""The indexer's selection as Triton bodies (docs/model.md §5.2, kernels/ops/dsa/README.md "Selection"): exact and
deterministic at any context, spread over the parts of a row's pools (no program streams a whole row), nothing
that depends on timing or on how many parts there are. The `sparse` kind's tasks call them; `select_launch` runs
them as plain launches, a pass a launch, for the tests.

A row with n cached tokens has P = n // kpool complete pools, each with an index score. Its selected tokens are
the first `TOPP` pools by score descending, ties by pool index ascending (the reference's stable sort), listed
by pool index ascending and expanded to their tokens, then the tail kpool·P .. n-1, then -1 up to the width.

While P <= TOPP every pool is taken. Past it, the TOPP-th largest score is found by a radix select over the
scores' bits: a score's float order as an unsigned 32-bit key (-0.0 as +0.0, which the reference's comparisons
do not tell apart), four passes of 8 bits, each a histogram of the digit of the keys whose higher bits match the
digits found so far. Then the pools above that key are taken, and of those equal to it the lowest-indexed, as
many as are left.

Over parts of PART pools (one program each; the sizes are one record, `SelectDims`, derived once by `select_dims`
from the caches' pools and passed whole from the layer's table and launch to its dispatch, which hands these bodies
its fields by their names): pass i (`select_pass`) of part q first picks pass i - 1's digit from the parts'
histograms summed (integers: any order, the same sums), as every part of the pass does alike (part 0 keeps the
result), and keeps the count of its own pools that the pick puts above the threshold; then it counts its pools'
digits at pass i. The last step (`select_take`) picks the last digit, works out from the counts how many pools the
parts before it take (so where its own go), and writes its part's tokens in pool order; part 0 also the tail and the
-1s. Parts past a row's pools do nothing.

With fewer passes as steps (knob select_passes, where the caches hold at most LOCAL_POOLS pools), the take
(`select_take_local`) picks the last pass's digit and finds the others itself, each a histogram over every pool's
key of the row (every part alike), the last one also counting the pools before its part: fewer hand-offs on the
path, more keys read by each take.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from glm53ctl.kernels import tlx  # noqa: F401 - the interpreter's settings before any kernel is defined


class SelectDims(NamedTuple):
    """The selection's sizes for caches of some number of pools (`select_dims`): one constexpr record, the same
    from the table (its tasks' parts) and the launch (its buffers) to the bodies."""

    PART: int  # pools per part: one program's share of a row's pools
    NQ_ROW: int  # the parts that cover a row's pools (a task each per pass)
    NQ: int  # NQ_ROW up to a power of two: the histograms' part axis
    BLOCK: int  # scores a program reads at once: at most 1024 (4 warps took 57 µs over 8,192 pools against 107
    # in blocks of 4096, H200, docs/perf/sparse.md)
    # the radix passes that are tasks of their own (knob select_passes): 4, or fewer where the caches hold at most
    # LOCAL_POOLS pools, the take then finding the threshold's last 4 - PASSES digits itself over every pool's key
    PASSES: int = 4
    ALL: int = 1024  # with PASSES < 4, the pools a take reads at once over the row (the row's, up to 1,024)


def select_part(pools: int) -> int:
    """Pools per part of a row's selection, for caches of `pools` pools: 256, or more where that would be more
    than 32 parts (each pass sums every part's histogram)."""
    return max(256, triton.next_power_of_2(-(-pools // 32)))


# the most pools a row's caches may hold for the take to find digits itself (knob select_passes): each take program
# then reads every pool's key once a digit, 16K tokens at most (4,096 pools)
LOCAL_POOLS = 4096


def select_dims(pools: int, part: int | None = None, passes: int = 4) -> SelectDims:
    """The selection's sizes for caches of `pools` pools, over parts of `part` pools (default `select_part`), with
    `passes` radix passes as tasks (knob select_passes) where the caches hold at most LOCAL_POOLS pools (else 4)."""
    part = part or select_part(pools)
    parts = -(-pools // part)
    passes = passes if pools <= LOCAL_POOLS else 4
    return SelectDims(
        PART=part,
        NQ_ROW=parts,
        NQ=triton.next_power_of_2(parts),
        BLOCK=min(part, 1024),
        PASSES=passes,
        ALL=min(triton.next_power_of_2(pools), 1024),
    )


@triton.jit
def score_key(s):
    """A score's order as an unsigned 32-bit key: a larger score has a larger key; -0.0 is +0.0."""
    s = tl.where(s == 0.0, 0.0, s)
    b = s.to(tl.int32, bitcast=True)
    # negative: every bit flipped (a more negative score, a smaller key); positive: the sign bit set
    return (b ^ ((b >> 31) | -(2**31))).to(tl.uint32, bitcast=True)


@triton.jit
def _digit_counts(scores, lo, hi, prefix, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """Per digit d [256]: the pools lo..hi - 1 whose key has digit d at SHIFT and whose bits above it equal
    prefix's."""
    counts = tl.zeros((256,), dtype=tl.int32)
    o_b = tl.arange(0, BLOCK)
    for p0 in range(lo, hi, BLOCK):
        o_p = p0 + o_b
        key = score_key(tl.load(scores + o_p, mask=o_p < hi, other=0.0))
        match = o_p < hi
        if SHIFT < 24:  # the digits found so far: the bits above this one
            match = match & ((key >> (SHIFT + 8)) == (prefix >> (SHIFT + 8)))
        counts += tl.histogram(((key >> SHIFT) & 255).to(tl.int32), 256, mask=match).to(tl.int32)
    return counts


@triton.jit
def _pick(hist, n_parts, prefix, left, SHIFT: tl.constexpr, NQ: tl.constexpr):
    """A pass's digit from its parts' histograms hist [NQ, 256] (the first n_parts written): the largest digit
    whose count of pools at or above it reaches `left`. Returns the parts' counts [NQ, 256], the digit, and the
    prefix and `left` after it."""
    o_q = tl.arange(0, NQ)
    o_d = tl.arange(0, 256)
    parts = tl.load(hist + o_q[:, None] * 256 + o_d[None, :], mask=o_q[:, None] < n_parts, other=0)
    d, prefix, left = _pick_counts(tl.sum(parts, axis=0), prefix, left, SHIFT)
    return parts, d, prefix, left


@triton.jit
def _pick_counts(counts, prefix, left, SHIFT: tl.constexpr):
    """The digit at SHIFT from a row's digit counts [256]: the largest digit whose count of pools at or above it
    reaches `left`; the prefix and `left` after it."""
    o_d = tl.arange(0, 256)
    above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0)
    d = tl.max(tl.where(above + counts >= left, o_d, -1), axis=0)
    left -= tl.sum(tl.where(o_d > d, counts, 0), axis=0)
    return d, prefix | (d.to(tl.uint32) << SHIFT), left


@triton.jit
def select_pass(
    scores,
    hist,
    state,
    above,
    n,
    q,
    I: tl.constexpr,
    KP: tl.constexpr,
    TOPP: tl.constexpr,
    PART: tl.constexpr,
    NQ: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Pass I (0..3) of part q of a row (n cached tokens): scores [>= P] fp32; hist [4, NQ, 256] int32 (pass,
    part, digit); state [4, 2] int32 (the prefix and `left` before pass I, kept by part 0); above [4, NQ] int32
    (the pools of a part above the threshold by pass I's digit). PART, NQ, BLOCK: `SelectDims`'s fields, by
    their names (a record cannot cross into a noinline task, the compiler's tuples being values)."""
    P = n // KP
    lo = q * PART
    if (P > TOPP) & (lo < P):
        n_parts = tl.cdiv(P, PART)
        prefix = tl.zeros((), dtype=tl.uint32)
        left = TOPP + 0 * P
        if I > 0:
            if I > 1:
                prefix = tl.load(state + (I - 1) * 2).to(tl.uint32, bitcast=True)
                left = tl.load(state + (I - 1) * 2 + 1)
            parts, d, prefix, left = _pick(hist + (I - 1) * NQ * 256, n_parts, prefix, left, 32 - 8 * I, NQ)
            o_q = tl.arange(0, NQ)
            o_d = tl.arange(0, 256)
            mine = tl.sum(tl.where((o_q[:, None] == q) & (o_d[None, :] > d), parts, 0), axis=1)
            tl.store(above + (I - 1) * NQ + o_q, mine, mask=o_q == q)
            if q == 0:
                tl.store(state + I * 2, prefix.to(tl.int32, bitcast=True))
                tl.store(state + I * 2 + 1, left)
        counts = _digit_counts(scores, lo, tl.minimum(lo + PART, P), prefix, 24 - 8 * I, BLOCK)
        tl.store(hist + (I * NQ + q) * 256 + tl.arange(0, 256), counts)


@triton.jit
def write_tail(idx, n, P, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    """After a row's taken pools in idx [WIDTH]: the tail (the tokens of the pool not yet complete, n cached tokens
    in P whole pools), then -1 up to WIDTH."""
    o_k = tl.arange(0, KP)
    first = tl.minimum(P, TOPP) * KP
    tl.store(idx + first + o_k, P * KP + o_k, mask=o_k < n - P * KP)
    o_b = tl.arange(0, BLOCK)
    for w0 in range(0, WIDTH, BLOCK):
        o_w = w0 + o_b
        tl.store(idx + o_w, -1, mask=(o_w >= first + n - P * KP) & (o_w < WIDTH))


@triton.jit
def _take_start(n, q, KP: tl.constexpr, TOPP: tl.constexpr, PART: tl.constexpr, BLOCK: tl.constexpr):
    """A take's start before the threshold is known: the row's P pools, its part's first pool lo, arange(BLOCK),
    and where the part's pools go while P <= TOPP (every pool taken): the threshold's key (prefix), how many pools
    at it are taken (left), the pools taken before the part and those of them at the threshold."""
    P = n // KP
    lo = q * PART
    o_b = tl.arange(0, BLOCK)
    return P, lo, o_b, tl.zeros((), dtype=tl.uint32), TOPP + 0 * P, lo, 0 * P


@triton.jit
def select_take(
    scores,
    idx,
    hist,
    state,
    above,
    n,
    q,
    KP: tl.constexpr,
    TOPP: tl.constexpr,
    WIDTH: tl.constexpr,
    PART: tl.constexpr,
    NQ: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Part q of a row's selected tokens into idx [WIDTH] int32 (n cached tokens), after its four passes
    (`select_pass`'s buffers). WIDTH: TOPP * KP + KP - 1, the most a row selects. PART, NQ, BLOCK:
    `SelectDims`'s fields."""
    P, lo, o_b, prefix, left, taken, at = _take_start(n, q, KP, TOPP, PART, BLOCK)
    if P > TOPP:
        n_parts = tl.cdiv(P, PART)
        prefix = tl.load(state + 3 * 2).to(tl.uint32, bitcast=True)
        left = tl.load(state + 3 * 2 + 1)
        parts, d, prefix, left = _pick(hist + 3 * NQ * 256, n_parts, prefix, left, 0, NQ)
        o_q = tl.arange(0, NQ)
        o_d = tl.arange(0, 256)
        m_q = o_q < n_parts
        eq = tl.sum(tl.where(o_d[None, :] == d, parts, 0), axis=1)
        up = tl.sum(tl.where(o_d[None, :] > d, parts, 0), axis=1)
        for k in tl.static_range(3):
            up += tl.load(above + k * NQ + o_q, mask=m_q, other=0)
        eq_before = tl.cumsum(eq, axis=0) - eq
        took = up + tl.minimum(tl.maximum(left - eq_before, 0), eq)
        taken = tl.sum(tl.where(o_q < q, took, 0), axis=0)
        at = tl.sum(tl.where(o_q == q, eq_before, 0), axis=0)
    _take_part(scores, idx, n, P, q, lo, o_b, prefix, left, taken, at, KP, TOPP, WIDTH, PART, BLOCK)


@triton.jit
def _take_part(scores, idx, n, P, q, lo, o_b, prefix, left, taken, at, KP: tl.constexpr, TOPP: tl.constexpr,
               WIDTH: tl.constexpr, PART: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Part q's pools taken into idx, in pool order, once the threshold is known (prefix: its key, `left`: how many
    pools at it are taken; `taken` pools go before the part, `at` of them at the threshold): every pool while P <=
    TOPP; else those above the threshold, and of those at it the first `left`. Part 0 also the tail and the -1s.
    lo: the part's first pool; o_b: arange(BLOCK)."""
    for p0 in range(lo, tl.minimum(lo + PART, P), BLOCK):
        o_p = p0 + o_b
        m = o_p < tl.minimum(lo + PART, P)
        key = score_key(tl.load(scores + o_p, mask=m, other=0.0))
        eq_p = m & (key == prefix)
        take = m & ((key > prefix) | (eq_p & (at + tl.cumsum(eq_p.to(tl.int32), axis=0) <= left)) | (P <= TOPP))
        slot = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        for j in tl.static_range(KP):
            tl.store(idx + slot * KP + j, o_p * KP + j, mask=take)
        taken += tl.sum(take.to(tl.int32), axis=0)
        at += tl.sum(eq_p.to(tl.int32), axis=0)
    if q == 0:
        write_tail(idx, n, P, KP, TOPP, WIDTH, BLOCK)


@triton.jit
def _last_digit(scores, P, lo, prefix, left, ALL: tl.constexpr):
    """The threshold's last digit (bits 7..0) over every pool's key (the row's P pools, ALL at a time), its first
    three digits in prefix; and of the pools before lo, how many are above the threshold and how many at it, in the
    same pass. Returns the threshold, `left` after it, the pools taken before lo (those above it, and as many of
    those at it as `left` allows) and those at it before lo."""
    counts = tl.zeros((256,), dtype=tl.int32)
    before = tl.zeros((256,), dtype=tl.int32)
    higher = 0 * P  # keys before lo whose first three digits are above prefix's
    o_a = tl.arange(0, ALL)
    for p0 in range(0, P, ALL):
        o_p = p0 + o_a
        m = o_p < P
        key = score_key(tl.load(scores + o_p, mask=m, other=0.0))
        match = m & ((key >> 8) == (prefix >> 8))
        digit = (key & 255).to(tl.int32)
        counts += tl.histogram(digit, 256, mask=match).to(tl.int32)
        before += tl.histogram(digit, 256, mask=match & (o_p < lo)).to(tl.int32)
        higher += tl.sum((m & (o_p < lo) & ((key >> 8) > (prefix >> 8))).to(tl.int32), axis=0)
    d, prefix, left = _pick_counts(counts, prefix, left, 0)
    o_d = tl.arange(0, 256)
    at = tl.sum(tl.where(o_d == d, before, 0), axis=0)
    above = higher + tl.sum(tl.where(o_d > d, before, 0), axis=0)
    return prefix, left, above + tl.minimum(left, at), at


@triton.jit
def select_take_local(scores, idx, hist, state, n, q, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr,
                      PART: tl.constexpr, NQ: tl.constexpr, BLOCK: tl.constexpr, PASSES: tl.constexpr,
                      ALL: tl.constexpr):  # fmt: skip
    """`select_take` after PASSES < 4 passes (knob select_passes): part q picks pass PASSES - 1's digit from the
    parts' histograms (none where PASSES is 0), then the threshold's other digits itself, each over every pool's
    key (`_digit_counts` over the row, then `_last_digit`, which also counts the pools before the part), instead
    of waiting for passes of their own; every part finds the same threshold. The same tokens in the same slots."""
    P, lo, o_b, prefix, left, taken, at = _take_start(n, q, KP, TOPP, PART, BLOCK)
    if (P > TOPP) & (lo < P):
        if PASSES > 0:
            if PASSES > 1:
                prefix = tl.load(state + (PASSES - 1) * 2).to(tl.uint32, bitcast=True)
                left = tl.load(state + (PASSES - 1) * 2 + 1)
            _, d, prefix, left = _pick(hist + (PASSES - 1) * NQ * 256, tl.cdiv(P, PART), prefix, left, 32 - 8 * PASSES,
                                       NQ)  # fmt: skip
        for i in tl.static_range(PASSES, 3):
            counts = _digit_counts(scores, 0, P, prefix, 24 - 8 * i, ALL)
            d, prefix, left = _pick_counts(counts, prefix, left, 24 - 8 * i)
        prefix, left, taken, at = _last_digit(scores, P, lo, prefix, left, ALL)
    _take_part(scores, idx, n, P, q, lo, o_b, prefix, left, taken, at, KP, TOPP, WIDTH, PART, BLOCK)


@triton.jit
def _pass_kernel(scores, hist, state, above, n, stride, I: tl.constexpr, KP: tl.constexpr, TOPP: tl.constexpr,
                 PART: tl.constexpr, NQ: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Program (part, row)."""
    q, r = tl.program_id(0), tl.program_id(1)
    select_pass(scores + r * stride, hist + r * (4 * NQ * 256), state + r * 8, above + r * (4 * NQ), tl.load(n + r),
                q, I, KP, TOPP, PART, NQ, BLOCK)  # fmt: skip


@triton.jit
def _take_kernel(scores, idx, hist, state, above, n, stride, KP: tl.constexpr, TOPP: tl.constexpr,
                 WIDTH: tl.constexpr, PART: tl.constexpr, NQ: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """Program (part, row)."""
    q, r = tl.program_id(0), tl.program_id(1)
    select_take(scores + r * stride, idx + r * WIDTH, hist + r * (4 * NQ * 256), state + r * 8,
                above + r * (4 * NQ), tl.load(n + r), q, KP, TOPP, WIDTH, PART, NQ, BLOCK)  # fmt: skip


@triton.jit
def _take_local_kernel(scores, idx, hist, state, n, stride, KP: tl.constexpr, TOPP: tl.constexpr,
                       WIDTH: tl.constexpr, PART: tl.constexpr, NQ: tl.constexpr, BLOCK: tl.constexpr,
                       PASSES: tl.constexpr, ALL: tl.constexpr):  # fmt: skip
    """Program (part, row): `select_take_local`."""
    q, r = tl.program_id(0), tl.program_id(1)
    select_take_local(scores + r * stride, idx + r * WIDTH, hist + r * (4 * NQ * 256), state + r * 8, tl.load(n + r),
                      q, KP, TOPP, WIDTH, PART, NQ, BLOCK, PASSES, ALL)  # fmt: skip


def select_launch(
    scores: torch.Tensor, n: torch.Tensor, spec, part: int | None = None, passes: int = 4
) -> torch.Tensor:
    """Every row's selected tokens: scores [R, >= max P] fp32 (a row's pools past its P unread), n [R] cached
    tokens -> idx [R, index_width] int32, as the reference's `select_token_rows`; over parts of `part` pools
    (`select_part` of the scores' width by default), a launch a pass (`passes` of them, knob select_passes, where
    the width allows: `select_dims`), then the take. The buffers start as garbage: nothing read is left from
    before."""
    return select_runner(scores, n, spec, part, passes)()


def select_runner(
    scores: torch.Tensor, n: torch.Tensor, spec, part: int | None = None, passes: int = 4
) -> Callable[[], torch.Tensor]:
    """`select_launch` made once (its buffers, garbage to start with) and launched at each call into the same
    buffers, returning idx: what `bench --op select` times in a CUDA graph, allocating nothing per call."""
    R, width = scores.shape
    ix = spec.indexer
    sel = select_dims(width, part, passes)
    nq = sel.NQ
    dev = scores.device
    idx = torch.empty(R, spec.index_width, dtype=torch.int32, device=dev)
    hist = torch.randint(-9, 9, (R, 4, nq, 256), dtype=torch.int32, device=dev)
    state = torch.randint(-9, 9, (R, 4, 2), dtype=torch.int32, device=dev)
    above = torch.randint(-9, 9, (R, 4, nq), dtype=torch.int32, device=dev)
    s = scores.float().contiguous()
    nn = n.to(torch.int32).to(dev).contiguous()
    consts = dict(KP=ix.kpool, TOPP=spec.index_pools, PART=sel.PART, NQ=sel.NQ, BLOCK=sel.BLOCK)

    def run() -> torch.Tensor:
        for i in range(sel.PASSES):
            _pass_kernel[(nq, R)](s, hist, state, above, nn, s.stride(0), I=i, **consts)
        if sel.PASSES == 4:
            _take_kernel[(nq, R)](s, idx, hist, state, above, nn, s.stride(0), WIDTH=spec.index_width, **consts)
        else:
            _take_local_kernel[(nq, R)](s, idx, hist, state, nn, s.stride(0), WIDTH=spec.index_width, PASSES=sel.PASSES,
                                        ALL=sel.ALL, **consts)  # fmt: skip
        return idx

    return run
