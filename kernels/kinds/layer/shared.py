"""The tasks every layer kernel has, whichever its halves: the mHC gates (mix logits, gate, comb), the GEMV partials
that end in an all-reduce (o_proj, down_proj), and the all-reduces with hc_post. The halves' own tasks are in
kda.py, mla.py (attention) and mlp.py, moe.py (FFN); the claim loop that dispatches to them in kernel.py.

Task bodies are not inlined, so the persistent loop carries none of their registers (inlined, the compiler hoists
their address vectors out of the loop: 255 registers and spills).
"""

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.moe import moe_sum_cols
from glm53ctl.kernels.ops.gemv.layer import PR
from glm53ctl.kernels.ops.mhc.kernel import (
    gate_comb,
    gate_pre,
    gate_scale,
    gate_x_hat,
    hc_post_cols,
    mix_row,
)
from glm53ctl.kernels.runtime.device import push_tag, push_to_peers
from glm53ctl.kernels.tlx import interpreting, pinned  # noqa: F401 (importing tlx applies the interpreter's settings)

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.kinds.layer.shared"


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_gate(
    mixp,
    ssp,
    gramp,
    H,
    base,
    scale,
    norm_w,
    x_hat,
    post,
    comb,
    pr,
    r,
    c,
    comb_task,
    hc_eps,
    norm_eps,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    NCH: tl.constexpr,
    CH: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Row r's gate from its chunks' mix logits, sums of squares and Gram matrices, summed in chunk order.
    GATE (comb false): chunk c of x̂; chunk 0 also post and pr[r]: pre [HC] and 1/RMS, what a GEMV with the
    norm folded into its weights scales its stream rows by (so it waits on chunk 0 alone). Every chunk's task
    sums the same partials in the same order: the same pre and 1/RMS bits. COMB (comb_task true): the Sinkhorn
    comb alone, off the path to the GEMV after the gate."""
    o_m = tl.arange(0, 32)
    o_j = tl.arange(0, HC)
    mix = tl.zeros((32,), dtype=tl.float32)
    ss = 0.0
    for k in tl.static_range(NCH):
        mix += tl.load(mixp + (k * 16 + r) * 32 + o_m)
        ss += tl.load(ssp + k * 16 + r)
    mix = gate_scale(mix, ss, norm_eps, D, HC)
    if comb_task:
        gate_comb(mix, base, scale, comb, r, hc_eps, HC, ITERS)
    else:
        o_g = o_j[:, None] * HC + o_j[None, :]
        gram = tl.zeros((HC, HC), dtype=tl.float32)
        for k in tl.static_range(NCH):
            gram += tl.load(gramp + (k * 16 + r) * (HC * HC) + o_g)
        b_pre, b_post, rstd = gate_pre(mix, gram, base, scale, hc_eps, norm_eps, D, HC)
        if c == 0:
            tl.store(post + r * HC + o_j, b_post)
            tl.store(pr + r * PR + o_j, b_pre)
            tl.store(pr + r * PR + HC, rstd)
        gate_x_hat(H + r * (HC * D), b_pre, rstd, norm_w, x_hat, r, c * CH + tl.arange(0, CH), D, HC, INTERPRET)


@triton.jit
def _store_mix(mixp, ssp, gramp, mix, ss, gram, c, r, HC: tl.constexpr):
    """Chunk c of row r's gate partials: mix logits [32], sum of squares, Gram matrix [HC, HC]."""
    o_j = tl.arange(0, HC)
    tl.store(mixp + (c * 16 + r) * 32 + tl.arange(0, 32), mix)
    tl.store(ssp + c * 16 + r, ss)
    tl.store(gramp + (c * 16 + r) * (HC * HC) + o_j[:, None] * HC + o_j[None, :], gram)


@triton.jit
def _own_partial(kpart, r, o_c, R, D: tl.constexpr, KS: tl.constexpr):
    """This rank's partial of row r over columns o_c: its K slices summed in slice order."""
    acc = tl.load(kpart + r * D + o_c)
    for ks in tl.static_range(1, KS):
        acc += tl.load(kpart + (ks * R + r) * D + o_c)
    return acc


@triton.jit
def _reduced(own, parts, r, o_c, R, RANK, D: tl.constexpr, T: tl.constexpr):
    """Row r's all-reduce over columns o_c: the ranks' partials summed in rank order (this rank's own, the
    peers' from `parts` [T, R, D]): the same bits on every rank."""
    acc = tl.where(RANK == 0, own, tl.load(parts + r * D + o_c, mask=RANK != 0, other=0.0))
    for q in tl.static_range(1, T):
        acc += tl.where(RANK == q, own, tl.load(parts + (q * R + r) * D + o_c, mask=RANK != q, other=0.0))
    return acc


@triton.jit
def _own(src, r, o_c, R, D: tl.constexpr, KS: tl.constexpr, MOE: tl.constexpr, TOPK: tl.constexpr, NSLOT: tl.constexpr):
    """This rank's partial of row r over columns o_c, from `src`: its K slices summed, src = (kpart,), or (MOE)
    the MoE's sum over the slots' outputs, src = (y, ids, weights, slot_of)."""
    if MOE:
        acc = moe_sum_cols(src[0], src[1], src[2], src[3], r, o_c, D, TOPK, NSLOT)
    else:
        acc = _own_partial(src[0], r, o_c, R, D, KS)
    return acc


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_mix(H, fn, mixp, ssp, gramp, c, r, D: tl.constexpr, HC: tl.constexpr, CH: tl.constexpr):
    """MIX_A (and MIX_F on H1): chunk c of row r's gate partials (`mix_row`)."""
    o_c = c * CH + tl.arange(0, CH)
    mix, ss, gram = mix_row(H, fn, r, o_c, D, HC)
    _store_mix(mixp, ssp, gramp, mix, ss, gram, c, r, HC)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_reduce(
    src,
    parts,
    out,
    H,
    post,
    comb,
    H_out,
    fn,
    mixp,
    ssp,
    gramp,
    c,
    r,
    R,
    RANK,
    D: tl.constexpr,
    HC: tl.constexpr,
    CH: tl.constexpr,
    KS: tl.constexpr,
    T: tl.constexpr,
    MIX: tl.constexpr,
    MOE: tl.constexpr,
    TOPK: tl.constexpr,
    NSLOT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """RED_A / RED_F: chunk c of row r: the all-reduce (out), hc_post (H_out); RED_A with MIX (no MIX_F tasks)
    also the FFN gate's partials over the chunk, from the stored (bf16) H_out values, as MIX_F makes them.
    Its own partial: `_own` of src."""
    o_c = c * CH + tl.arange(0, CH)
    a = _reduced(_own(src, r, o_c, R, D, KS, MOE, TOPK, NSLOT), parts, r, o_c, R, RANK, D, T)
    tl.store(out + r * D + o_c, a)
    hc_post_cols(a, H, post, comb, H_out, r, o_c, D, HC, INTERPRET)
    if MIX:
        mix, ss, gram = mix_row(H_out, fn, r, o_c, D, HC)
        _store_mix(mixp, ssp, gramp, mix, ss, gram, c, r, HC)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_own(
    src,
    parts,
    c,
    r,
    R,
    RANK,
    D: tl.constexpr,
    CH: tl.constexpr,
    KS: tl.constexpr,
    MOE: tl.constexpr,
    TOPK: tl.constexpr,
    NSLOT: tl.constexpr,
):
    """OWN_A / OWN_F: this rank's partial of chunk c of row r, for the other ranks' reduces."""
    o_c = c * CH + tl.arange(0, CH)
    tl.store(parts + (RANK * R + r) * D + o_c, _own(src, r, o_c, R, D, KS, MOE, TOPK, NSLOT))


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_push(
    src,
    slot_bases,
    flag_bases,
    arrive,
    epoch,
    c,
    r,
    R,
    RANK,
    peer_words,
    n_pushers,
    mute,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    CH: tl.constexpr,
    KS: tl.constexpr,
    T: tl.constexpr,
    MOE: tl.constexpr,
    TOPK: tl.constexpr,
    NSLOT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """OWN_A / OWN_F on real ranks: this rank's partial of chunk c of row r into slot RANK of every peer's
    mailbox [2 (parity), 2 (GROUP: attention, FFN), T, R, D], the half of this launch's parity; the last of the
    group's `n_pushers` tasks tags it in every peer's flag words, after their first `peer_words` (the whole
    table's task words: push_tag; `mute`: never)."""
    o_c = c * CH + tl.arange(0, CH)
    own = _own(src, r, o_c, R, D, KS, MOE, TOPK, NSLOT)
    at = ((epoch % 2) * 2 + GROUP) * (T * R * D) + (RANK * R + r) * D
    push_to_peers(own, slot_bases, at, RANK, o_c, o_c < D, T)
    push_tag(flag_bases, arrive + GROUP, epoch, RANK, peer_words + GROUP * (T - 1), n_pushers, mute, T, INTERPRET)


# ---- the gate's two steps as plain launches, laid out as the layer lays them (`bench --op gate`)


@triton.jit
def _mix_kernel(H, fn, mixp, ssp, gramp, D: tl.constexpr, HC: tl.constexpr, CH: tl.constexpr):
    """Program (chunk c, row r): a MIX task."""
    task_mix(H, fn, mixp, ssp, gramp, tl.program_id(0), tl.program_id(1), D, HC, CH)


@triton.jit
def _gate_kernel(
    mixp, ssp, gramp, H, base, scale, norm_w, x_hat, post, comb, pr, hc_eps, norm_eps, D: tl.constexpr,
    HC: tl.constexpr, ITERS: tl.constexpr, NCH: tl.constexpr, CH: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """Program (chunk c, row r): the GATE task of chunk c, or the COMB task at c = NCH."""
    c, r = tl.program_id(0), tl.program_id(1)
    task_gate(mixp, ssp, gramp, H, base, scale, norm_w, x_hat, post, comb, pr, r, c, c == NCH, hc_eps, norm_eps, D, HC,
              ITERS, NCH, CH, INTERPRET)  # fmt: skip


def gate_runner(H, fn, base, scale, norm_w, spec, chunk: int = 128) -> Callable:
    """The mHC gate of H [R, hc, D] bf16 as the layer runs it: a MIX task per row and column chunk (its mix
    logits, sums of squares and Gram partials), then a GATE task per chunk (x̂'s chunk; chunk 0 post) and a COMB
    task per row, each a program; made once, launched at each call into the same buffers. Returns (x̂, post,
    comb), as ops/mhc's `gate`."""
    R, hc, D = H.shape
    assert R <= 16, "the gates' partials hold 16 rows a chunk (the layer's buffers)"
    CH = min(chunk, D // 4)
    NCH, dev = D // CH, H.device
    f32 = dict(dtype=torch.float32, device=dev)
    mixp, ssp = torch.empty(NCH, 16, 32, **f32), torch.empty(NCH, 16, **f32)
    gramp = torch.empty(NCH, 16, hc * hc, **f32)
    x_hat = torch.empty(R, D, dtype=torch.bfloat16, device=dev)
    post, comb, pr = torch.empty(R, hc, **f32), torch.empty(R, hc, hc, **f32), torch.empty(16, PR.value, **f32)
    consts = dict(D=D, HC=hc, CH=CH)
    eps = (spec.mhc.eps, spec.model.rms_norm_eps)
    gate_consts = consts | dict(ITERS=spec.mhc.sinkhorn_iters, NCH=NCH, INTERPRET=interpreting())

    def run():
        _mix_kernel[(NCH, R)](H, fn, mixp, ssp, gramp, **consts)
        _gate_kernel[(NCH + 1, R)](mixp, ssp, gramp, H, base, scale, norm_w, x_hat, post, comb, pr, *eps, **gate_consts)
        return x_hat, post, comb

    run.pr = pr  # the rows' pre and 1/RMS, what a folded GEMV reads (the tests compare them too)
    return run
