"""The MoE, the FFN half of `kda` and `sparse`, as tasks of the layer kernel (kernel.py, constexpr MOE): the router
tiles over K slices, the routing decided in the launch (a task per row; the last to arrive makes the slots; with knob
route=each a routed gate/up task decides its own slot's expert from the router's logits), each slot's gate/up over K
slices and its down tiles (the bodies of kernels/ops/ffn/moe.py), and their dispatch. The FFN
reduce of each row and column chunk sums the slots in expert order (shared.py `_own`).

Its arguments (launch.py): weights `MoeWeights` (w_r, r_bias, and the experts stacked [E + 1, ...], the shared
one last: w_eg, w_eu, w_ed), buffers `MoeBuffers` (the router's K-slice sums, the routing: ids, wts, route_on, the
slots, and per slot its gate/up sums, act and output).
"""

import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.moe import (
    decided_slot_expert,
    expert_gate_up,
    make_slots,
    route_row,
    router_tile,
    slot_expert,
    store_act,
    task_expert_down,
)
from glm53ctl.kernels.ops.ffn.tasks import (
    EXP_DOWN,
    EXP_GU,
    ROUTE,
    ROUTER,
)
from glm53ctl.kernels.runtime.device import arrive_last, stamp, wait_task
from glm53ctl.kernels.runtime.tasks import fields, may_run
from glm53ctl.kernels.tlx import pinned

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.kinds.layer.moe"


@triton.jit
def moe_task(
    ttype,
    claim,
    ok,
    ffn_w,
    ffn_buf,
    hand,
    outs,
    R,
    dims: tl.constexpr,
    moe: tl.constexpr,
    sched: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    """The MoE's task `task`, if it is one: ROUTER, ROUTE, EXP_GU or EXP_DOWN. Returns ok, false where a late wait
    failed."""
    if may_run(sched.ONLY, ROUTER) and (ttype == ROUTER):
        e0, ks = fields(claim.row, ROUTER)
        router_tile(
            outs.x_hat_f, ffn_w.w_r, ffn_buf.logits, e0, ks, R, moe.E, dims.D, moe.KS_RT, moe.BLOCK_E, moe.BK_RT,
            INTERPRET,
        )  # fmt: skip
    elif may_run(sched.ONLY, ROUTE) and (ttype == ROUTE):
        r = fields(claim.row, ROUTE)
        task_route(
            logits=ffn_buf.logits,
            bias=ffn_w.r_bias,
            ids=ffn_buf.ids,
            wts=ffn_buf.wts,
            on=ffn_buf.route_on,
            slots=ffn_buf.slots,
            n_slots=ffn_buf.n_slots,
            slot_of=ffn_buf.slot_of,
            arrive=hand.arrive + R * dims.HL,
            epoch=claim.epoch,
            r=r,
            R=R,
            E=moe.E,
            KS=moe.KS_RT,
            BLOCK_E=moe.E_ALL,
            TOPK=moe.TOPK,
            SCALE=moe.SCALE,
            NSLOT=moe.NSLOT,
        )
    elif may_run(sched.ONLY, EXP_GU) and (ttype == EXP_GU):
        j, n0, ks = fields(claim.row, EXP_GU)
        decided = False
        if moe.EACH:  # knob route=each: a routed slot decides its expert itself (the shared one needs none)
            decided = j != moe.NSLOT
        if decided:
            ok = task_decided_gate_up(
                claim, hand.trace, outs.x_hat_f, ffn_w.w_eg, ffn_w.w_eu,
                ffn_buf.gup_m, ffn_buf.act_m, ffn_buf.logits, ffn_w.r_bias, j, n0, ks, R, moe.E, dims.I, dims.D,
                moe.E_ALL, moe.KS_RT, moe.TOPK, moe.SCALE, dims.BN_GU, dims.BK_GU, dims.LIMIT, dims.KS_GU,
                sched.TRACE, INTERPRET, POLL, THREADS,
            )  # fmt: skip
        else:
            ok = task_expert_gate_up(
                claim=claim,
                trace=hand.trace,
                x=outs.x_hat_f,
                w_gate=ffn_w.w_eg,
                w_up=ffn_w.w_eu,
                gup=ffn_buf.gup_m,
                act=ffn_buf.act_m,
                slots=ffn_buf.slots,
                n_slots=ffn_buf.n_slots,
                j=j,
                n0=n0,
                ks=ks,
                R=R,
                E=moe.E,
                I=dims.I,
                D=dims.D,
                NSLOT=moe.NSLOT,
                BN=dims.BN_GU,
                BK=dims.BK_GU,
                LIMIT=dims.LIMIT,
                KS=dims.KS_GU,
                TRACE=sched.TRACE,
                INTERPRET=INTERPRET,
                POLL=POLL,
                THREADS=THREADS,
            )
    elif may_run(sched.ONLY, EXP_DOWN) and (ttype == EXP_DOWN):
        j, n0 = fields(claim.row, EXP_DOWN)
        task_expert_down(
            ffn_buf.act_m, ffn_w.w_ed, ffn_buf.y_m, ffn_buf.slots, ffn_buf.n_slots, j, n0, R, moe.E, dims.I, dims.D,
            moe.NSLOT, moe.BN_DN, dims.BK_I, INTERPRET,
        )  # fmt: skip
    return ok


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_route(
    logits,
    bias,
    ids,
    wts,
    on,
    slots,
    n_slots,
    slot_of,
    arrive,
    epoch,
    r,
    R,
    E: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE: tl.constexpr,
    NSLOT: tl.constexpr,
):
    """ROUTE (row r): the row's routing (`route_row`); the last row to arrive (`arrive_last`) makes the slots
    from every row's choice, so the tasks after wait on every row's ROUTE and find the slots made."""
    route_row(logits, bias, ids, wts, on, r, E, KS, BLOCK_E, TOPK, SCALE)
    # every thread's stores before the release, and (one row) before make_slots reads `on` in another layout
    tl.debug_barrier()
    last = True
    if R > 1:
        last = arrive_last(arrive, epoch, R)
    if last:
        make_slots(on, slots, n_slots, slot_of, R, E, BLOCK_E, NSLOT)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_expert_gate_up(
    claim,
    trace,
    x,
    w_gate,
    w_up,
    gup,
    act,
    slots,
    n_slots,
    j,
    n0,
    ks,
    R,
    E: tl.constexpr,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    LIMIT: tl.constexpr,
    KS: tl.constexpr,
    TRACE: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    """EXP_GU (slot j, rows n0.. of the intermediate, K slice ks of KS: knob ksplit_gu): the slot's gate and up
    (`slot_gate_up`), its expert read from the slots the routing made. True unless a wait failed."""
    expert, live = slot_expert(slots, n_slots, j, E, NSLOT)
    return slot_gate_up(
        claim, trace, x, w_gate, w_up, gup, act, expert, live, j, n0, ks, R, I,
        D, BN, BK, LIMIT, KS, TRACE, INTERPRET, POLL, THREADS,
    )  # fmt: skip


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_decided_gate_up(
    claim, trace, x, w_gate, w_up, gup, act, logits, bias, j, n0, ks, R,
    E: tl.constexpr, I: tl.constexpr, D: tl.constexpr, E_ALL: tl.constexpr, KS_RT: tl.constexpr, TOPK: tl.constexpr,
    SCALE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, LIMIT: tl.constexpr, KS: tl.constexpr,
    TRACE: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """EXP_GU of a routed slot j under knob route=each: its expert decided here from the router's logits and bias
    (`decided_slot_expert`, the routing's own picks), so the task waits on the router, not on the routing: the
    routing's hand-off and its own length leave the path. Then as `task_expert_gate_up`."""
    expert, live = decided_slot_expert(logits, bias, j, R, E, KS_RT, E_ALL, TOPK, SCALE)
    return slot_gate_up(
        claim, trace, x, w_gate, w_up, gup, act, expert, live, j, n0, ks, R, I,
        D, BN, BK, LIMIT, KS, TRACE, INTERPRET, POLL, THREADS,
    )  # fmt: skip


@triton.jit
def slot_gate_up(
    claim, trace, x, w_gate, w_up, gup, act, expert, live, j, n0, ks, R,
    I: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, LIMIT: tl.constexpr, KS: tl.constexpr,
    TRACE: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """Slot j's gate and up over K slice ks of KS for expert `expert` (`expert_gate_up`; nothing where not
    `live`: a slot no row chose). A slice but the first stores its sums in `gup` [NSLOT + 1, KS, 2, 16, I] and is
    done; slice 0 then waits (late: every slice 0 does, chosen or not, so every site can be stuck) for them, adds
    them in slice order, and makes the slot's act. True unless a wait failed."""
    g = tl.zeros((16, BN), dtype=tl.float32)
    u = tl.zeros((16, BN), dtype=tl.float32)
    if live:
        g, u = expert_gate_up(x, w_gate, w_up, expert, n0, ks, R, I, D, KS, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    p_gup = gup + (j * KS * 2 * 16 + o_m[:, None]) * I + o_n[None, :]
    m_gup = (o_m[:, None] < R) & (o_n[None, :] < I)
    ok = claim.task >= 0
    if ks != 0:
        if live:
            tl.store(p_gup + (ks * 2) * (16 * I), g, mask=m_gup)
            tl.store(p_gup + (ks * 2 + 1) * (16 * I), u, mask=m_gup)
    else:
        if KS > 1:
            if TRACE:
                stamp(trace, claim.task, 4, INTERPRET)
            ok = wait_task(claim, INTERPRET, POLL, THREADS, True)
        if ok & live:
            for q in tl.static_range(1, KS):
                g += tl.load(p_gup + (q * 2) * (16 * I), mask=m_gup, other=0.0)
                u += tl.load(p_gup + (q * 2 + 1) * (16 * I), mask=m_gup, other=0.0)
            store_act(g, u, act + j * 16 * I, n0, R, I, BN, LIMIT, INTERPRET)
    return ok
