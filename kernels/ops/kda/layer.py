"""KDA, the attention half of `dense` and `kda`, as tasks of the layer kernel (kernel.py, constexpr MLA false):
the fused in-projection and the KDA heads (the bodies of kernels/ops/kda), and their dispatch. o_proj and the
all-reduce after it are every layer's (shared.py).

Its arguments (launch.py): weights `KdaWeights` (w_in, w_fb, w_gb, conv_w, A_log, dt_bias, o_norm, w_o), states
`KdaStates` (conv_in, S_in read; conv_out, S_out written: double-buffered), buffers `KdaBuffers` (y_in [R, NIN]
fp32, lr [R, 2 RG] bf16, z [R, P] bf16: what o_proj reads, kscr: a head's parts' o, ipp: the in-projection's K-slice
sums).
"""

import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import gemv_first_weights, gemv_tile, gemv_tile_from
from glm53ctl.kernels.ops.gemv.layer import fold_rows, gemv_rows, wait_after_weights
from glm53ctl.kernels.ops.kda.kernel import (
    kda_head,
    kda_norm,
    kda_write_state,
)
from glm53ctl.kernels.ops.kda.tasks import INPROJ, KDA_HEAD
from glm53ctl.kernels.runtime.device import arrive_last, stamp, wait_task
from glm53ctl.kernels.runtime.tasks import fields, may_run
from glm53ctl.kernels.tlx import pinned, to_bf16

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.kinds.layer.kda"


@triton.jit
def kda_task(
    ttype, claim, ok, H, attn_w, attn_state, attn_buf, hand, outs, consts, R, dims: tl.constexpr, sched: tl.constexpr,
    INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """The KDA half's task `task` (row: its table row), if it is one: INPROJ or KDA_HEAD. Returns ok, false where
    one of its late waits failed."""
    if may_run(sched.ONLY, INPROJ) and (ttype == INPROJ):
        n0, ks = fields(claim.row, INPROJ)
        ok = task_inproj(
            claim, hand.trace, H if sched.FOLD else outs.x_hat_a, attn_w.w_in, hand.pr, attn_buf.ipp, attn_buf.y_in,
            attn_buf.lr, n0, ks, R, dims, sched, INTERPRET, POLL, THREADS,
        )  # fmt: skip
    elif may_run(sched.ONLY, KDA_HEAD) and (ttype == KDA_HEAD):
        h, r, part = fields(claim.row, KDA_HEAD)
        task_kda(
            claim.epoch, attn_buf.y_in, attn_buf.lr, attn_w.w_fb, attn_w.w_gb, attn_state.conv_in, attn_state.conv_out,
            attn_w.conv_w, attn_w.A_log, attn_w.dt_bias, attn_w.o_norm, attn_state.S_in, attn_state.S_out, attn_buf.z,
            attn_buf.kscr, hand.arrive, h, r, part, R, consts.lower_bound, consts.norm_eps, dims, sched, INTERPRET,
        )  # fmt: skip
    return ok


@triton.jit
def kda_write_back(attn_state, attn_buf, r, h, part, dims: tl.constexpr, INTERPRET: tl.constexpr):
    """Knob oproj_first: head h of row r's new states (part `part`), recomputed from S_in with the same operations
    as its task (the same bits), after the task its program ran next (an o_proj tile)."""
    kda_write_state(
        scr=attn_buf.kscr, u=attn_buf.y_in + dims.HDR, u_row=dims.NIN, u_part=dims.K, u_head=3 * dims.K,
        conv_in=attn_state.conv_in, conv_out=attn_state.conv_out, S_in=attn_state.S_in, S_out=attn_state.S_out, r=r,
        h=h, part=part, H=dims.HL, K=dims.K, W=dims.W, NV=dims.NV, INTERPRET=INTERPRET,
    )  # fmt: skip


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_inproj(
    claim, trace, x, w_in, pr, ipp, y_in, lr, n0, ks, R, dims: tl.constexpr, sched: tl.constexpr,
    INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """INPROJ: rows n0.. of the fused in-projection over K slice ks of KS (knob ksplit_in), y_in fp32 and the
    low-rank f_a | g_a rows also in bf16 (lr). A slice but the first stores its sums in `ipp` [KS, 32, NIN] and
    is done; slice 0 waits (late) for them and adds them in slice order.

    x: x̂ [R, D], or (FOLD: knob `norm` "fold", or "auto" at rows <= 4; `gemv.folds`) H's R * HC stream rows
    against w_in ⊙ norm_w, needing nothing from the gate: slice 0 then also waits (late) for the gates and makes
    y[r] = 1/RMS[r] * sum_j pre[r, j] * acc[r * HC + j] (x = sum_j pre_j H_j is linear in H). True unless a
    wait failed."""
    XR = gemv_rows(R, dims, sched)
    KS: tl.constexpr = dims.KS_IN  # its own constexpr: tl.static_range takes no field of a record
    KK: tl.constexpr = dims.D // KS
    ok = claim.task >= 0
    # knob weights_first: the first weight chunk in flight, then the early waits (the loop left them)
    if sched.WEIGHTS_FIRST:
        b_w0 = gemv_first_weights(w_in + ks * KK, n0, dims.NIN, dims.D, dims.BN, dims.BK_IN)
        ok = wait_after_weights(claim, trace, sched, INTERPRET, POLL, THREADS)
        acc = gemv_tile_from(
            b_w0, x + ks * KK, dims.D, w_in + ks * KK, n0, XR, dims.NIN, KK, dims.D, dims.BN, dims.BK_IN, INTERPRET,
            dims.M,
        )  # fmt: skip
    else:
        acc = gemv_tile(
            x + ks * KK, dims.D, w_in + ks * KK, n0, XR, dims.NIN, KK, dims.D, dims.BN, dims.BK_IN, INTERPRET, dims.M
        )
    o_s = tl.arange(0, dims.M)
    o_n = n0 + tl.arange(0, dims.BN)
    p_ipp = ipp + o_s[:, None] * dims.NIN + o_n[None, :]
    m_ipp = (o_s[:, None] < XR) & (o_n[None, :] < dims.NIN) & ok
    if ks != 0:
        tl.store(p_ipp + ks * (32 * dims.NIN), acc, mask=m_ipp)
    elif ok:
        if (KS > 1) or sched.FOLD:
            if sched.TRACE:
                stamp(trace, claim.task, 4, INTERPRET)
            ok = wait_task(claim, INTERPRET, POLL, THREADS, True)
        if ok:
            for q in tl.static_range(1, KS):
                acc += tl.load(p_ipp + q * (32 * dims.NIN), mask=m_ipp, other=0.0)
            if sched.FOLD:
                y = fold_rows(acc, pr, R, dims.HC, dims.M, dims.BN)
                o_m = tl.arange(0, dims.M // dims.HC)
            else:
                y = acc
                o_m = tl.arange(0, dims.M)
            m_r = o_m[:, None] < R
            tl.store(y_in + o_m[:, None] * dims.NIN + o_n[None, :], y, mask=m_r & (o_n[None, :] < dims.NIN))
            m_lr = m_r & (o_n[None, :] < 2 * dims.RG)
            tl.store(lr + o_m[:, None] * (2 * dims.RG) + o_n[None, :], to_bf16(y, INTERPRET), mask=m_lr)
    return ok


@triton.jit
def _last_part(arrive, epoch, r, h, HL: tl.constexpr, NV: tl.constexpr):
    """Whether this part of head h (row r) is the last of its NV to arrive (`arrive_last`), after its o is stored:
    the one that makes the head's z."""
    if NV > 1:
        tl.debug_barrier()  # every thread's o stored before the release
        last = arrive_last(arrive + r * HL + h, epoch, NV)
    else:
        last = True
    return last


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_kda(
    epoch, y_in, lr, w_fb, w_gb, conv_in, conv_out, conv_w, A_log, dt_bias, o_norm, S_in, S_out, z, kscr, arrive, h, r,
    part, R, lower_bound, eps, dims: tl.constexpr, sched: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """KDA: part `part` (of NV, knob kda_split) of head h of row r: f_b and g_b for the head (each a [16, K]
    GEMV over the low-rank rows), the delta rule on the part's value columns (their o to `kscr`). The head's
    last part to arrive (`arrive_last`) makes its z from every part's o: the gated RMSNorm. No part waits for
    another: the last one finds the others' o already there."""
    P: tl.constexpr = dims.HL * dims.K
    NIN: tl.constexpr = 2 * dims.RG + dims.HL + 3 * P
    sel = tl.arange(0, 16)[:, None] == r
    f_h = gemv_tile(lr, 2 * dims.RG, w_fb, h * dims.K, R, P, dims.RG, dims.RG, dims.K, dims.BK_R, INTERPRET)
    og_h = gemv_tile(lr + dims.RG, 2 * dims.RG, w_gb, h * dims.K, R, P, dims.RG, dims.RG, dims.K, dims.BK_R, INTERPRET)
    kda_head(
        y_in + 2 * dims.RG + dims.HL, NIN, dims.K, 3 * dims.K, tl.load(y_in + r * NIN + 2 * dims.RG + h),
        tl.sum(tl.where(sel, f_h, 0.0), axis=0), conv_in, conv_out, conv_w, A_log, dt_bias, S_in, S_out, kscr, r,
        h, part, lower_bound, dims.HL, dims.K, dims.W, dims.NV, INTERPRET, not sched.OPROJ_FIRST,
    )  # fmt: skip
    last = _last_part(arrive, epoch, r, h, dims.HL, dims.NV)
    if last:
        kda_norm(kscr, tl.sum(tl.where(sel, og_h, 0.0), axis=0), o_norm, z, r, h, eps, dims.HL, dims.K, INTERPRET)
