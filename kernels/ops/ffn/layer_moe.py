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
    ttype, claim, ok, ffn_w, ffn_buf, hand, outs, R, dims: tl.constexpr, moe: tl.constexpr, sched: tl.constexpr,
    INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
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
            ffn_buf.logits, ffn_w.r_bias, ffn_buf.ids, ffn_buf.wts, ffn_buf.route_on, ffn_buf.slots, ffn_buf.n_slots,
            ffn_buf.slot_of, hand.arrive + R * dims.HL, claim.epoch, r, R, moe,
        )  # fmt: skip
    elif may_run(sched.ONLY, EXP_GU) and (ttype == EXP_GU):
        j, n0, ks = fields(claim.row, EXP_GU)
        decided = False
        if moe.EACH:  # knob route=each: a routed slot decides its expert itself (the shared one needs none)
            decided = j != moe.NSLOT
        if decided:
            ok = task_decided_gate_up(
                claim, hand.trace, outs.x_hat_f, ffn_w.w_eg, ffn_w.w_eu, ffn_buf.gup_m, ffn_buf.act_m, ffn_buf.logits,
                ffn_w.r_bias, j, n0, ks, R, dims, moe, sched, INTERPRET, POLL, THREADS,
            )  # fmt: skip
        else:
            ok = task_expert_gate_up(
                claim, hand.trace, outs.x_hat_f, ffn_w.w_eg, ffn_w.w_eu, ffn_buf.gup_m, ffn_buf.act_m, ffn_buf.slots,
                ffn_buf.n_slots, j, n0, ks, R, dims, moe, sched, INTERPRET, POLL, THREADS,
            )  # fmt: skip
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
    logits, bias, ids, wts, on, slots, n_slots, slot_of, arrive, epoch, r, R, moe: tl.constexpr,
):  # fmt: skip
    """ROUTE (row r): the row's routing (`route_row`); the last row to arrive (`arrive_last`) makes the slots
    from every row's choice, so the tasks after wait on every row's ROUTE and find the slots made."""
    route_row(logits, bias, ids, wts, on, r, moe.E, moe.KS_RT, moe.E_ALL, moe.TOPK, moe.SCALE)
    # every thread's stores before the release, and (one row) before make_slots reads `on` in another layout
    tl.debug_barrier()
    last = True
    if R > 1:
        last = arrive_last(arrive, epoch, R)
    if last:
        make_slots(on, slots, n_slots, slot_of, R, moe.E, moe.E_ALL, moe.NSLOT)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_expert_gate_up(
    claim, trace, x, w_gate, w_up, gup, act, slots, n_slots, j, n0, ks, R, dims: tl.constexpr, moe: tl.constexpr,
    sched: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """EXP_GU (slot j, rows n0.. of the intermediate, K slice ks of KS: knob ksplit_gu): the slot's gate and up
    (`slot_gate_up`), its expert read from the slots the routing made. True unless a wait failed."""
    expert, live = slot_expert(slots, n_slots, j, moe.E, moe.NSLOT)
    return slot_gate_up(
        claim, trace, x, w_gate, w_up, gup, act, expert, live, j, n0, ks, R, dims, sched, INTERPRET, POLL, THREADS
    )


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_decided_gate_up(
    claim, trace, x, w_gate, w_up, gup, act, logits, bias, j, n0, ks, R, dims: tl.constexpr, moe: tl.constexpr,
    sched: tl.constexpr, INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """EXP_GU of a routed slot j under knob route=each: its expert decided here from the router's logits and bias
    (`decided_slot_expert`, the routing's own picks), so the task waits on the router, not on the routing: the
    routing's hand-off and its own length leave the path. Then as `task_expert_gate_up`."""
    expert, live = decided_slot_expert(logits, bias, j, R, moe.E, moe.KS_RT, moe.E_ALL, moe.TOPK, moe.SCALE)
    return slot_gate_up(
        claim, trace, x, w_gate, w_up, gup, act, expert, live, j, n0, ks, R, dims, sched, INTERPRET, POLL, THREADS
    )


@triton.jit
def slot_gate_up(
    claim, trace, x, w_gate, w_up, gup, act, expert, live, j, n0, ks, R, dims: tl.constexpr, sched: tl.constexpr,
    INTERPRET: tl.constexpr, POLL: tl.constexpr, THREADS: tl.constexpr,
):  # fmt: skip
    """Slot j's gate and up over K slice ks of KS for expert `expert` (`expert_gate_up`; nothing where not
    `live`: a slot no row chose). A slice but the first stores its sums in `gup` [NSLOT + 1, KS, 2, 16, I] and is
    done; slice 0 then waits (late: every slice 0 does, chosen or not, so every site can be stuck) for them, adds
    them in slice order, and makes the slot's act. True unless a wait failed."""
    # constexprs of their own: a shape or tl.static_range takes no field of a record
    KS: tl.constexpr = dims.KS_GU
    BN: tl.constexpr = dims.BN_GU
    g = tl.zeros((16, BN), dtype=tl.float32)
    u = tl.zeros((16, BN), dtype=tl.float32)
    if live:
        g, u = expert_gate_up(
            x, w_gate, w_up, expert, n0, ks, R, dims.I, dims.D, dims.KS_GU, dims.BN_GU, dims.BK_GU, INTERPRET
        )
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, dims.BN_GU)
    p_gup = gup + (j * dims.KS_GU * 2 * 16 + o_m[:, None]) * dims.I + o_n[None, :]
    m_gup = (o_m[:, None] < R) & (o_n[None, :] < dims.I)
    ok = claim.task >= 0
    if ks != 0:
        if live:
            tl.store(p_gup + (ks * 2) * (16 * dims.I), g, mask=m_gup)
            tl.store(p_gup + (ks * 2 + 1) * (16 * dims.I), u, mask=m_gup)
    else:
        if dims.KS_GU > 1:
            if sched.TRACE:
                stamp(trace, claim.task, 4, INTERPRET)
            ok = wait_task(claim, INTERPRET, POLL, THREADS, True)
        if ok & live:
            for q in tl.static_range(1, KS):
                g += tl.load(p_gup + (q * 2) * (16 * dims.I), mask=m_gup, other=0.0)
                u += tl.load(p_gup + (q * 2 + 1) * (16 * dims.I), mask=m_gup, other=0.0)
            store_act(g, u, act + j * 16 * dims.I, n0, R, dims.I, dims.BN_GU, dims.LIMIT, INTERPRET)
    return ok
