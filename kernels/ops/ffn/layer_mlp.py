"""The dense MLP, the FFN half of `dense`, as tasks of the layer kernel (kernel.py, constexpr MOE false): gate/up
with the clamped SwiGLU, and down_proj's partials (its all-reduce is every layer's: shared.py), and their
dispatch.

Its arguments (launch.py): weights `MlpWeights` (w_gate, w_up, w_down), buffers `MlpBuffers` (act [R, I] bf16:
what down_proj reads; gup: gate/up's K-slice sums).
"""

import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.kernel import swiglu_act
from glm53ctl.kernels.ops.ffn.tasks import DOWN, GU
from glm53ctl.kernels.ops.gemv.kernel import gemv_first_weights, gemv_tile_pair, gemv_tile_pair_from
from glm53ctl.kernels.ops.gemv.layer import PR, fold_rows, gemv_rows, task_partial, wait_after_weights
from glm53ctl.kernels.runtime.device import stamp, wait_task
from glm53ctl.kernels.runtime.tasks import fields, may_run
from glm53ctl.kernels.tlx import pinned, to_bf16

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.kinds.layer.mlp"


@triton.jit
def mlp_task(
    ttype, claim, ok, ffn_w, ffn_buf, hand, outs, R, dims: tl.constexpr, sched: tl.constexpr, INTERPRET: tl.constexpr,
    POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """The dense MLP's task `task`, if it is one: GU or DOWN. Returns ok, false where a late wait failed."""
    if may_run(sched.ONLY, GU) and (ttype == GU):
        n0, ks = fields(claim.row, GU)
        ok = task_gate_up(
            claim, hand.trace, outs.H1 if sched.FOLD else outs.x_hat_f, ffn_w.w_gate, ffn_w.w_up, hand.pr + 16 * PR,
            ffn_buf.gup, ffn_buf.act, n0, ks, R, dims, sched, INTERPRET, POLL, THREADS,
        )  # fmt: skip
    elif may_run(sched.ONLY, DOWN) and (ttype == DOWN):
        n0, ks = fields(claim.row, DOWN)
        ok = task_partial(
            claim, x=ffn_buf.act + ks * dims.IK, w=ffn_w.w_down + ks * dims.IK, out=hand.kpart_f + ks * R * dims.D,
            n0=n0, R=R, N=dims.D, K=dims.IK, STRIDE=dims.I, BN=dims.BN_O, BK=dims.BK_I, INTERPRET=INTERPRET, POLL=POLL,
            THREADS=THREADS, FIRST=sched.WEIGHTS_FIRST, PDL=sched.PDL_FIRST,
        )  # fmt: skip
    return ok


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_gate_up(
    claim, trace, x, w_gate, w_up, pr, gup, act, n0, ks, R, dims: tl.constexpr, sched: tl.constexpr,
    INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """GU: gate and up rows n0.. over K slice ks of KS (knob ksplit_gu), both in one K loop. A slice but the
    first stores its sums in `gup` [KS, 2, 32, I] and is done; slice 0 then waits (late) for them, adds them
    in slice order, and makes the clamped SwiGLU: act, bf16, for down_proj.

    x: x̂ [R, D], or (FOLD, as for the in-projection) H1's R * HC stream rows against w_gate and w_up ⊙ norm_w:
    slice 0 then also waits (late) for the FFN gates and applies their pre and 1/RMS, as the folded
    in-projection does. True unless a wait failed."""
    ok = claim.task >= 0
    XR = gemv_rows(R, dims, sched)
    KS: tl.constexpr = dims.KS_GU  # its own constexpr: tl.static_range takes no field of a record
    KK: tl.constexpr = dims.D // KS
    # knob weights_first: both first weight chunks in flight, then the early waits (the loop left them)
    if sched.WEIGHTS_FIRST:
        b_g0 = gemv_first_weights(w_gate + ks * KK, n0, dims.I, dims.D, dims.BN_GU, dims.BK_GU)
        b_u0 = gemv_first_weights(w_up + ks * KK, n0, dims.I, dims.D, dims.BN_GU, dims.BK_GU)
        ok = wait_after_weights(claim, trace, sched, INTERPRET, POLL, THREADS)
        g_s, u_s = gemv_tile_pair_from(
            b_g0, b_u0, x + ks * KK, dims.D, w_gate + ks * KK, w_up + ks * KK, n0, XR, dims.I, KK, dims.D, dims.BN_GU,
            dims.BK_GU, INTERPRET, dims.M,
        )  # fmt: skip
    else:
        g_s, u_s = gemv_tile_pair(
            x + ks * KK, dims.D, w_gate + ks * KK, w_up + ks * KK, n0, XR, dims.I, KK, dims.D, dims.BN_GU, dims.BK_GU,
            INTERPRET, dims.M,
        )  # fmt: skip
    o_s = tl.arange(0, dims.M)
    o_n = n0 + tl.arange(0, dims.BN_GU)
    p_gup = gup + o_s[:, None] * dims.I + o_n[None, :]
    m_gup = (o_s[:, None] < XR) & (o_n[None, :] < dims.I) & ok
    if ks != 0:
        tl.store(p_gup + (ks * 2) * (32 * dims.I), g_s, mask=m_gup)
        tl.store(p_gup + (ks * 2 + 1) * (32 * dims.I), u_s, mask=m_gup)
    elif ok:
        if (KS > 1) or sched.FOLD:
            if sched.TRACE:
                stamp(trace, claim.task, 4, INTERPRET)
            ok = wait_task(claim, INTERPRET, POLL, THREADS, True)
        if ok:
            for q in tl.static_range(1, KS):
                g_s += tl.load(p_gup + (q * 2) * (32 * dims.I), mask=m_gup, other=0.0)
                u_s += tl.load(p_gup + (q * 2 + 1) * (32 * dims.I), mask=m_gup, other=0.0)
            if sched.FOLD:
                g = fold_rows(g_s, pr, R, dims.HC, dims.M, dims.BN_GU)
                u = fold_rows(u_s, pr, R, dims.HC, dims.M, dims.BN_GU)
                o_m = tl.arange(0, dims.M // dims.HC)
            else:
                g = g_s
                u = u_s
                o_m = tl.arange(0, dims.M)
            tl.store(
                act + o_m[:, None] * dims.I + o_n[None, :],
                to_bf16(swiglu_act(g, u, dims.LIMIT), INTERPRET),
                mask=(o_m[:, None] < R) & (o_n[None, :] < dims.I),
            )
    return ok
