"""The layer kernel: the claim loop over one layer's tasks (table.py) and their dispatch, to the tasks every layer
has (the mHC gates, o_proj, the all-reduces: shared.py) and to its two halves: the attention half, KDA (kda.py)
or MLA (mla.py, constexpr MLA), and the FFN half, the dense MLP (mlp.py) or the MoE (moe.py, constexpr MOE). An
absent half is absent: its arguments are not passed and its code is not built.

Arguments, by concern (namedtuples, launch.py `LayerArgs`): the runtime's buffers (rt), the streams in (H), the
gates' weights, each half's weights, states or caches, and hand-off buffers, the hand-offs every layer has, the
outputs, the model's scalars; then the runtime's scalars and the compile-time dims and schedule.

Knob `oproj_first` lives here: a KDA task publishes (its head's z, if it arrived last) and leaves its step (decay,
k, delta: 3 vectors) in scratch; its program runs its next task (an o_proj tile, as the table orders them), then
recomputes the new recurrent state from S_in with the same operations (the same bits) and writes both states back.
"""

import triton
import triton.language as tl

from glm53ctl.kernels.kinds.layer.prefetch import prefetch
from glm53ctl.kernels.kinds.layer.shared import task_gate, task_mix, task_own, task_push, task_reduce
from glm53ctl.kernels.ops.dsa.layer import mla_task
from glm53ctl.kernels.ops.dsa.tasks import MLA_A, SEL_PASS, WUV
from glm53ctl.kernels.ops.ffn.layer_mlp import mlp_task
from glm53ctl.kernels.ops.ffn.layer_moe import moe_task
from glm53ctl.kernels.ops.ffn.tasks import DOWN, EXP_DOWN, GU, ROUTER
from glm53ctl.kernels.ops.gemv.layer import PR, task_partial
from glm53ctl.kernels.ops.gemv.tasks import OPROJ
from glm53ctl.kernels.ops.kda.layer import kda_task, kda_write_back
from glm53ctl.kernels.ops.kda.tasks import INPROJ, KDA_HEAD
from glm53ctl.kernels.ops.mhc.tasks import (
    COMB_A,
    COMB_F,
    GATE_A,
    GATE_F,
    MIX_A,
    MIX_F,
    OWN_A,
    OWN_F,
    RED_A,
    RED_F,
)
from glm53ctl.kernels.runtime import device
from glm53ctl.kernels.runtime.tasks import fields, may_run

# each half's task types (MLA's and KDA's; the MoE's and the dense MLP's): with knob stage_code=own a stage's kernel
# holds a half's dispatch only where it runs one of them (`may_run`)
ATTN_HALF = tl.constexpr((*range(MLA_A.value, WUV.value + 1), SEL_PASS.value, INPROJ.value, KDA_HEAD.value))
FFN_HALF = tl.constexpr((*range(ROUTER.value, EXP_DOWN.value + 1), GU.value, DOWN.value))


@triton.jit
def _gate(
    ttype, row, H, gates, hand, outs, consts, ffn: tl.constexpr, dims: tl.constexpr, INTERPRET: tl.constexpr
):  # fmt: skip
    """A gate or comb task of the attention gate (ffn false: on H) or of the FFN gate (on H1)."""
    r, c = fields(row, GATE_A)  # a gate's fields; a comb's r, its c 0
    if ffn:
        x, base, scale, norm_w = outs.H1, gates.base_f, gates.scale_f, gates.norm_f
        x_hat, post, comb = outs.x_hat_f, outs.post_f, outs.comb_f
    else:
        x, base, scale, norm_w = H, gates.base_a, gates.scale_a, gates.norm_a
        x_hat, post, comb = outs.x_hat_a, outs.post_a, outs.comb_a
    # the FFN gate's mix logits and pre/RMS rows after the attention gate's
    at: tl.constexpr = 1 if ffn else 0
    mixp, ssp = hand.mixp + at * (dims.NCH * 16 * 32), hand.ssp + at * (dims.NCH * 16)
    gramp, pr = hand.gram + at * (dims.NCH * 16 * dims.HC * dims.HC), hand.pr + at * (16 * PR)
    comb_task = ttype == (COMB_F if ffn else COMB_A)
    task_gate(
        mixp, ssp, gramp, x, base, scale, norm_w, x_hat, post, comb, pr, r, c, comb_task, consts.hc_eps,
        consts.norm_eps, dims.D, dims.HC, dims.ITERS, dims.NCH, dims.CH, INTERPRET,
    )  # fmt: skip


@triton.jit
def _is_attn_half(ttype, MLA: tl.constexpr):
    """Whether a task is the attention half's own: MLA's (its types are consecutive ids, and the selection's
    passes) or KDA's."""
    if MLA:
        yes = ((ttype >= MLA_A) & (ttype <= WUV)) | (ttype == SEL_PASS)
    else:
        yes = (ttype == INPROJ) | (ttype == KDA_HEAD)
    return yes


@triton.jit
def _waits_in_body(ttype, MLA: tl.constexpr, MOE: tl.constexpr):
    """Knob weights_first: the tasks that wait for their early sites in their bodies, after their first weights
    (KDA's in-projection, the dense MLP's gate/up; o_proj's and down's sites are late instead)."""
    yes = ttype < 0
    if not MLA:
        yes = yes | (ttype == INPROJ)
    if not MOE:
        yes = yes | (ttype == GU)
    return yes


@triton.jit
def _weights_first(ttype, MLA: tl.constexpr, MOE: tl.constexpr):
    """Knob weights_first: the tasks that issue their first weights before they wait (and, chained by PDL,
    before gdc_wait): those of _waits_in_body, and o_proj and down_proj (whose sites are late)."""
    return _waits_in_body(ttype, MLA, MOE) | (ttype == OPROJ) | (ttype == DOWN)


@triton.jit
def _is_ffn_half(ttype, MOE: tl.constexpr):
    """Whether a task is the FFN half's own: the MoE's (consecutive ids) or the dense MLP's."""
    if MOE:
        yes = (ttype >= ROUTER) & (ttype <= EXP_DOWN)
    else:
        yes = (ttype == GU) | (ttype == DOWN)
    return yes


@triton.jit
def _run_task(
    ttype, claim, ok, H, gates, attn_w, attn_state, attn_buf, ffn_w, ffn_buf,
    hand, outs, consts, R, RANK, peers, mute, n_pushers, dims: tl.constexpr, mla: tl.constexpr,
    moe: tl.constexpr, sched: tl.constexpr, MLA: tl.constexpr, MOE: tl.constexpr, INTERPRET: tl.constexpr,
    POLL: tl.constexpr, THREADS: tl.constexpr, REMOTE: tl.constexpr,
):  # fmt: skip
    """One task, whose inputs have arrived: the tasks every layer has (the gates, o_proj's partial, the
    all-reduces or a peer's partials) and the halves' own, in one chain of tests in the order a layer runs them
    (the order of the kernel before the halves were parts). Returns ok, false where a late wait failed."""
    ONLY: tl.constexpr = sched.ONLY  # the types this launch's code holds: a branch of none of them is not built
    row = claim.row
    epoch = claim.epoch
    TOPK: tl.constexpr = moe.TOPK if MOE else 1
    NSLOT: tl.constexpr = moe.NSLOT if MOE else 1
    if MLA:  # what o_proj reads: the MLA heads' W_UV outputs, or the KDA heads' z
        attn_o = attn_buf.o_mla
    else:
        attn_o = attn_buf.z
    if MOE:  # what this rank's FFN partial is summed from (shared.py `_own`)
        ffn_src = (ffn_buf.y_m, ffn_buf.ids, ffn_buf.wts, ffn_buf.slot_of)
    else:
        ffn_src = (hand.kpart_f,)
    w_o = attn_w.w_o
    D: tl.constexpr = dims.D
    NCH: tl.constexpr = dims.NCH
    f_gram = hand.gram + NCH * 16 * dims.HC * dims.HC  # the FFN gate's Gram partials, after the attention gate's
    # the peers' partials: one device, the buffers the peers' launches filled; real ranks, this rank's mailbox
    # (its half of this launch's parity; the attention's, then the FFN's), read after a system-scope fence
    parts_a = hand.parts_a
    parts_f = hand.parts_f
    if REMOTE:
        parts_a = peers.slots + ((epoch % 2) * 2) * (dims.T * R * D)
        parts_f = parts_a + dims.T * R * D
    if may_run(ONLY, MIX_A) and (ttype == MIX_A):
        c, r = fields(row, MIX_A)
        task_mix(H=H, fn=gates.fn_a, mixp=hand.mixp, ssp=hand.ssp, gramp=hand.gram, c=c, r=r, D=D, HC=dims.HC,
                 CH=dims.CH)  # fmt: skip
    elif may_run(ONLY, GATE_A, COMB_A) and ((ttype == GATE_A) | (ttype == COMB_A)):
        _gate(ttype, row, H, gates, hand, outs, consts, False, dims, INTERPRET)
    elif may_run(ONLY, ATTN_HALF) and _is_attn_half(ttype, MLA):
        if MLA:
            mla_task(ttype, row, H, attn_w, attn_state, attn_buf, outs, consts, R, dims, mla, ONLY, INTERPRET)
        else:
            ok = kda_task(ttype, claim, ok, H, attn_w, attn_state, attn_buf,
                          hand, outs, consts, R, dims, sched, INTERPRET, POLL, THREADS)  # fmt: skip
    elif may_run(ONLY, OPROJ) and (ttype == OPROJ):
        n0, ks = fields(row, OPROJ)
        ok = task_partial(
            claim, x=attn_o + ks * dims.PK, w=w_o + ks * dims.PK,
            out=hand.kpart_a + ks * R * D, n0=n0, R=R, N=D, K=dims.PK, STRIDE=dims.P, BN=dims.BN_O, BK=dims.BK_O,
            INTERPRET=INTERPRET, POLL=POLL, THREADS=THREADS, FIRST=sched.WEIGHTS_FIRST, PDL=sched.PDL_FIRST,
        )  # fmt: skip
    elif may_run(ONLY, RED_A) and (ttype == RED_A):
        c, r = fields(row, RED_A)
        if REMOTE:
            device.fence_sys(INTERPRET)
        task_reduce(
            src=(hand.kpart_a,), parts=parts_a, out=outs.attn, H=H, post=outs.post_a, comb=outs.comb_a,
            H_out=outs.H1, fn=gates.fn_f, mixp=hand.mixp + NCH * 16 * 32, ssp=hand.ssp + NCH * 16, gramp=f_gram,
            c=c, r=r, R=R,
            RANK=RANK, D=D, HC=dims.HC, CH=dims.CH, KS=dims.KS_O, T=dims.T, MIX=not sched.MIX_TASK, MOE=False,
            TOPK=TOPK, NSLOT=NSLOT, INTERPRET=INTERPRET,
        )  # fmt: skip
    elif may_run(ONLY, MIX_F) and (ttype == MIX_F):
        c, r = fields(row, MIX_F)
        task_mix(
            H=outs.H1, fn=gates.fn_f, mixp=hand.mixp + NCH * 16 * 32, ssp=hand.ssp + NCH * 16, gramp=f_gram, c=c,
            r=r, D=D, HC=dims.HC, CH=dims.CH,
        )  # fmt: skip
    elif may_run(ONLY, GATE_F, COMB_F) and ((ttype == GATE_F) | (ttype == COMB_F)):
        _gate(ttype, row, H, gates, hand, outs, consts, True, dims, INTERPRET)
    elif may_run(ONLY, FFN_HALF) and _is_ffn_half(ttype, MOE):
        if MOE:
            ok = moe_task(ttype, claim, ok, ffn_w, ffn_buf, hand, outs, R, dims,
                          moe, sched, INTERPRET, POLL, THREADS)  # fmt: skip
        else:
            ok = mlp_task(ttype, claim, ok, ffn_w, ffn_buf, hand, outs, R, dims,
                          sched, INTERPRET, POLL, THREADS)  # fmt: skip
    elif may_run(ONLY, RED_F) and (ttype == RED_F):
        c, r = fields(row, RED_F)
        if REMOTE:
            device.fence_sys(INTERPRET)
        task_reduce(
            src=ffn_src, parts=parts_f, out=outs.ffn_out, H=outs.H1, post=outs.post_f, comb=outs.comb_f,
            H_out=outs.H2, fn=gates.fn_f, mixp=hand.mixp, ssp=hand.ssp, gramp=hand.gram, c=c, r=r, R=R, RANK=RANK,
            D=D, HC=dims.HC, CH=dims.CH, KS=dims.KS_F, T=dims.T, MIX=False, MOE=MOE, TOPK=TOPK, NSLOT=NSLOT,
            INTERPRET=INTERPRET,
        )  # fmt: skip
    elif may_run(ONLY, OWN_A) and ((ttype == OWN_A) & REMOTE):
        c, r = fields(row, OWN_A)
        task_push(
            src=(hand.kpart_a,), slot_bases=peers.slot_bases, flag_bases=peers.flag_bases, arrive=peers.arrive,
            epoch=epoch, c=c, r=r, R=R, RANK=RANK, peer_words=peers.words, n_pushers=n_pushers, mute=mute,
            GROUP=0, D=D, CH=dims.CH, KS=dims.KS_O, T=dims.T, MOE=False, TOPK=TOPK, NSLOT=NSLOT, INTERPRET=INTERPRET,
        )  # fmt: skip
    elif may_run(ONLY, OWN_F) and ((ttype == OWN_F) & REMOTE):
        c, r = fields(row, OWN_F)
        task_push(
            src=ffn_src, slot_bases=peers.slot_bases, flag_bases=peers.flag_bases, arrive=peers.arrive, epoch=epoch,
            c=c, r=r, R=R, RANK=RANK, peer_words=peers.words, n_pushers=n_pushers, mute=mute, GROUP=1, D=D,
            CH=dims.CH, KS=dims.KS_F, T=dims.T, MOE=MOE, TOPK=TOPK, NSLOT=NSLOT, INTERPRET=INTERPRET,
        )  # fmt: skip
    elif may_run(ONLY, OWN_A) and (ttype == OWN_A):
        c, r = fields(row, OWN_A)
        task_own(
            src=(hand.kpart_a,), parts=hand.parts_a, c=c, r=r, R=R, RANK=RANK, D=D, CH=dims.CH, KS=dims.KS_O,
            MOE=False, TOPK=TOPK, NSLOT=NSLOT,
        )  # fmt: skip
    elif may_run(ONLY, OWN_F) and (ttype == OWN_F):
        c, r = fields(row, OWN_F)
        task_own(
            src=ffn_src, parts=hand.parts_f, c=c, r=r, R=R, RANK=RANK, D=D, CH=dims.CH, KS=dims.KS_F, MOE=MOE,
            TOPK=TOPK, NSLOT=NSLOT,
        )  # fmt: skip
    return ok


@triton.jit(do_not_specialize=["stuck_site", "budget_ns", "RANK", "n_tasks", "n_peers", "n_programs", "mute",
                               "n_pushers"])  # fmt: skip
def layer_kernel(
    rt,
    H,
    gates,
    attn_w,
    attn_state,
    attn_buf,
    ffn_w,
    ffn_buf,
    hand,
    outs,
    consts,
    R,
    RANK,
    peers,
    mute,
    n_pushers,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    dims: tl.constexpr,
    mla: tl.constexpr,
    moe: tl.constexpr,
    sched: tl.constexpr,
    MLA: tl.constexpr,
    MOE: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
    PDL: tl.constexpr,
    ONE_TASK: tl.constexpr,
    REMOTE: tl.constexpr,
):
    ctl = rt[0]
    if sched.PDL_FIRST:  # chained, weights first: the next launch may start now; each task's body waits (pdl_wait)
        tl.extra.cuda.gdc_launch_dependents()
    elif PDL:  # a stage of separate-pdl: ask for this program's first weights while the launch before ends
        first = device.task_row(rt, tl.minimum(tl.program_id(0), n_tasks - 1))
        prefetch(first, gates, attn_w, attn_state, ffn_w, dims, MLA, MOE, 1, sched.MIX_TASK, sched.ONLY)
        device.pdl_enter(INTERPRET)
    epoch = device.launch_epoch(ctl, INTERPRET)
    n_done = 0
    # oproj_first: the KDA head whose states this program still has to write back
    pend = 0
    pend_r = 0
    pend_h = 0
    pend_p = 0
    task = device.first_task(ctl, n_tasks, n_programs, INTERPRET, ONE_TASK)
    while task >= 0:
        claim = device.claim_of(rt, task, epoch, stuck_site, budget_ns)
        row, ttype = claim.row, device.row_type(claim.row)
        if sched.TRACE:
            device.stamp(hand.trace, task, 0, INTERPRET)
        if sched.PREFETCH and not INTERPRET:  # the interpreter has no inline asm; a prefetch changes no bits
            prefetch(row, gates, attn_w, attn_state, ffn_w, dims, MLA, MOE, sched.PREFETCH, sched.MIX_TASK, sched.ONLY)
        # a task's early sites; its late ones (a folded INPROJ's gates, a KDA head's other parts) in its body
        if sched.WEIGHTS_FIRST:  # the in-projection and (dense's) gate/up wait in their bodies, after their weights
            if _waits_in_body(ttype, MLA, MOE):
                ok = task >= 0
            elif _weights_first(ttype, MLA, MOE):  # o_proj and down: pdl_wait and their late sites in their bodies
                ok = device.wait_task(claim, INTERPRET, POLL, THREADS, False)
            else:
                device.pdl_wait(sched.PDL_FIRST)
                ok = device.wait_task(claim, INTERPRET, POLL, THREADS, False)
        else:
            ok = device.wait_task(claim, INTERPRET, POLL, THREADS, False)
        if sched.TRACE:
            device.stamp(hand.trace, task, 1, INTERPRET)
        if ok:
            ok = _run_task(ttype, claim, ok, H, gates, attn_w, attn_state,
                           attn_buf, ffn_w, ffn_buf, hand, outs, consts, R, RANK, peers, mute, n_pushers, dims,
                           mla, moe, sched, MLA, MOE, INTERPRET, POLL, THREADS, REMOTE)  # fmt: skip
            if ok:
                device.publish(rt, row, task, epoch, INTERPRET)
                if sched.TRACE:
                    device.stamp(hand.trace, task, 2, INTERPRET)
        if sched.OPROJ_FIRST:
            # a KDA head of an earlier task: its states now, after the task that followed it (o is out, that
            # task's loads issued); then this task's head, if it is one, waits for the next task
            if pend != 0:
                kda_write_back(attn_state, attn_buf, pend_r, pend_h, pend_p, dims, INTERPRET)
                pend = 0
            if (ttype == KDA_HEAD) & ok:
                pend = 1
                pend_h, pend_r, pend_p = fields(row, KDA_HEAD)
        n_done += 1
        task = device.after_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok, ONE_TASK)
    if sched.OPROJ_FIRST:
        if pend != 0:
            kda_write_back(attn_state, attn_buf, pend_r, pend_h, pend_p, dims, INTERPRET)
    device.finish(ctl, rt[1], n_tasks, n_peers, n_programs, epoch)
