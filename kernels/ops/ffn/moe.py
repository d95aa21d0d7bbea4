"""The MoE as Triton bodies (docs/model.md §6.2): the router, the routing decided on the device, the touched
experts' clamped SwiGLU, and their sum in a fixed order. A kind's tasks call these bodies; `moe_launch` runs
them as plain launches, one per step, for the tests (the `kda` and `sparse` kinds will run them as tasks).

The routing is decided where the rows are, with no host round trip and nothing that depends on timing:

- `router_tile` (a task as it is): the logits of experts e0.. for every row, fp32 sums of bf16 products.
- `route` (a task as it is): per row, s = sigmoid(logits), the top-k of s + bias by score descending then
  index ascending (exact ties by index), the weights s / (Σ s + 1e-20) × scale from the unbiased scores; then
  the experts any row chose, in ascending order, as slots: slot j is expert `slots[j]`, `n_slots[0]` of them,
  with each row's weight and whether it chose it. A touched expert's weights are then read once for all the rows
  that chose it, and an expert nobody chose is not read at all.
- `expert_act_tile` (slot, rows n0.. of its intermediate): gate and up in one K loop, the clamped SwiGLU,
  stored bf16 (what the down projection reads); `expert_down_tile` (slot, output columns n0..): its down
  projection, fp32. The shared expert is one more slot, always on, weight 1.
- `task_moe_sum` (row, column chunk): the shared expert's output, then each slot the row chose in ascending
  expert order times its weight, in fp32: the reference's order, so the same bits whatever the grid or schedule.

Expert parallelism would plug in at the slots: a rank holding whole experts runs the slots whose expert it
owns (all columns of it) and publishes its partial sum as TP mode does; the reduce across ranks is unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.kernel import swiglu_act
from glm53ctl.kernels.ops.gemv.kernel import gemv_tile, gemv_tile_pair
from glm53ctl.kernels.tlx import interpreting, to_bf16


@triton.jit(noinline=True)
def router_tile(
    x_hat, w_r, logits, e0, R, E, D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr
):
    """logits[r, e0:e0 + BLOCK_E] (fp32, [R, E]) = x̂[r] · W_r[e] for every row r: x̂ [R, D] bf16, W_r [E, D]
    bf16."""
    acc = gemv_tile(x_hat, D, w_r, e0, R, E, D, D, BLOCK_E, BLOCK_K, INTERPRET)
    o_m = tl.arange(0, 16)
    o_e = e0 + tl.arange(0, BLOCK_E)
    tl.store(logits + o_m[:, None] * E + o_e[None, :], acc, mask=(o_m[:, None] < R) & (o_e[None, :] < E))


@triton.jit
def topk_row(logits, bias, r, E: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr, SCALE: tl.constexpr):
    """Row r's routing over the experts [BLOCK_E]: which it chooses (1/0) and their weights (0 elsewhere). The
    top-k of s + bias by score descending, then index ascending (an exact tie goes to the lower index); the
    weights from the unbiased s, normalized, times SCALE."""
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    s = tl.sigmoid(tl.load(logits + r * E + o_e, mask=m_e, other=0.0))
    key = tl.where(m_e, s + tl.load(bias + o_e, mask=m_e, other=0.0), float("-inf"))
    chosen = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for _ in tl.static_range(TOPK):
        best = tl.max(key, axis=0)
        pick = tl.min(tl.where(key == best, o_e, BLOCK_E), axis=0)
        chosen = tl.where(o_e == pick, 1, chosen)
        key = tl.where(o_e == pick, float("-inf"), key)
    s_chosen = tl.where(chosen == 1, s, 0.0)
    return chosen, s_chosen / (tl.sum(s_chosen, axis=0) + 1e-20) * SCALE


@triton.jit(noinline=True)
def route(
    logits,
    bias,
    ids,
    weights,
    slots,
    n_slots,
    slot_w,
    slot_on,
    R,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE: tl.constexpr,
    NSLOT: tl.constexpr,
):
    """Every row's routing from logits [16, E] fp32 (rows past R unread) and bias [E] fp32: ids
    [R, TOPK] int32 (ascending) and weights [R, TOPK] fp32; then the slots: slots [NSLOT] int32 (the chosen
    experts ascending, -1 past n_slots[0]), slot_w [NSLOT, 16] fp32 (row r's weight for slot j, 0 if it did not
    choose it) and slot_on [NSLOT, 16] int32 (whether it did). Two passes over the rows (the union first, then
    each row's place in it), recomputing each row's top-k rather than reading back what this program stored."""
    o_e = tl.arange(0, BLOCK_E)
    touched = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for r in range(R):
        chosen, w = topk_row(logits, bias, r, E, BLOCK_E, TOPK, SCALE)
        # ascending expert order: a chosen expert's place is the count of chosen experts before it
        place = tl.cumsum(chosen, axis=0) - 1
        tl.store(ids + r * TOPK + place, o_e, mask=chosen == 1)
        tl.store(weights + r * TOPK + place, w, mask=chosen == 1)
        touched = touched | chosen
    slot_of = tl.cumsum(touched, axis=0) - 1
    n = tl.sum(touched, axis=0)
    o_j = tl.arange(0, NSLOT)
    tl.store(slots + o_j, tl.full((NSLOT,), -1, tl.int32), mask=o_j >= n)
    tl.store(slots + slot_of, o_e, mask=touched == 1)
    tl.store(n_slots + tl.arange(0, 1), tl.full((1,), 0, tl.int32) + n)
    for r in range(16):
        chosen = tl.zeros((BLOCK_E,), dtype=tl.int32)
        w = tl.zeros((BLOCK_E,), dtype=tl.float32)
        if r < R:  # rows past R choose nothing (their logits are never written)
            chosen, w = topk_row(logits, bias, r, E, BLOCK_E, TOPK, SCALE)
        tl.store(slot_on + slot_of * 16 + r, chosen, mask=touched == 1)
        tl.store(slot_w + slot_of * 16 + r, w, mask=touched == 1)


@triton.jit
def expert_act_tile(
    x_hat,
    w_gate,
    w_up,
    act,
    expert,
    n0,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """act[r, n0:n0 + BLOCK_N] (bf16, [16, I]) = the clamped SwiGLU of expert `expert`'s gate and up rows n0..
    for every row: w_gate, w_up [E, I, D] bf16 (this rank's share of every expert's intermediate)."""
    base = expert.to(tl.int64) * I * D
    g, u = gemv_tile_pair(x_hat, D, w_gate + base, w_up + base, n0, R, I, D, D, BLOCK_N, BLOCK_K, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(
        act + o_m[:, None] * I + o_n[None, :],
        to_bf16(swiglu_act(g, u, LIMIT), INTERPRET),
        mask=(o_m[:, None] < R) & (o_n[None, :] < I),
    )


@triton.jit
def expert_down_tile(
    act,
    w_down,
    y,
    expert,
    n0,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """y[r, n0:n0 + BLOCK_N] (fp32, [16, D]) = expert `expert`'s down projection of act [16, I] bf16: w_down
    [E, D, I] bf16."""
    acc = gemv_tile(act, I, w_down + expert.to(tl.int64) * D * I, n0, R, D, I, I, BLOCK_N, BLOCK_K, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(y + o_m[:, None] * D + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < D))


# ---- the bodies as a persistent launch's tasks (not inlined: the claim loop carries none of their registers)


@triton.jit(noinline=True)
def task_expert_act(
    x_hat,
    w_gate,
    w_up,
    shared_gate,
    shared_up,
    act,
    slots,
    n_slots,
    j,
    n0,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """EXP_GU (slot j, rows n0.. of the intermediate): slot NSLOT is the shared expert (no routing needed); a
    routed slot past the experts chosen is skipped, so an expert nobody chose is never read."""
    if j == NSLOT:
        expert_act_tile(
            x_hat, shared_gate, shared_up, act + j * 16 * I, j * 0, n0, R, I, D, BLOCK_N, BLOCK_K, LIMIT, INTERPRET
        )
    elif j < tl.load(n_slots):
        expert_act_tile(
            x_hat, w_gate, w_up, act + j * 16 * I, tl.load(slots + j), n0, R, I, D, BLOCK_N, BLOCK_K, LIMIT, INTERPRET
        )


@triton.jit(noinline=True)
def task_expert_down(
    act,
    w_down,
    shared_down,
    y,
    slots,
    n_slots,
    j,
    n0,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """EXP_DOWN (slot j, output columns n0..): the slot's down projection."""
    if j == NSLOT:
        expert_down_tile(act + j * 16 * I, shared_down, y + j * 16 * D, j * 0, n0, R, I, D, BLOCK_N, BLOCK_K, INTERPRET)
    elif j < tl.load(n_slots):
        expert_down_tile(
            act + j * 16 * I, w_down, y + j * 16 * D, tl.load(slots + j), n0, R, I, D, BLOCK_N, BLOCK_K, INTERPRET
        )


@triton.jit(noinline=True)
def task_moe_sum(y, n_slots, slot_w, slot_on, out, c, r, D: tl.constexpr, NSLOT: tl.constexpr, CH: tl.constexpr):
    """MOE_SUM (chunk c of row r): this rank's MoE partial over the chunk, into out [R, D] (what the FFN reduce
    adds across ranks): the shared expert's output (slot NSLOT of y [NSLOT + 1, 16, D]), then each slot row r
    chose, in ascending expert order, times its weight, in fp32: the reference's order."""
    o_c = c * CH + tl.arange(0, CH)
    acc = tl.load(y + (NSLOT * 16 + r) * D + o_c)
    n = tl.load(n_slots)
    for j in tl.static_range(NSLOT):
        on = tl.load(slot_on + j * 16 + r, mask=j < n, other=0)
        w = tl.load(slot_w + j * 16 + r, mask=j < n, other=0.0)
        b_y = tl.load(y + (j * 16 + r) * D + o_c, mask=(j < n) & (on == 1), other=0.0)
        acc = tl.where((j < n) & (on == 1), acc + w * b_y, acc)
    tl.store(out + r * D + o_c, acc)


# ---- plain launches, one per step, of the task bodies above (tests; a kind runs them as tasks)


@triton.jit
def _router_kernel(
    x_hat, w_r, logits, R, E, D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr
):
    router_tile(x_hat, w_r, logits, tl.program_id(0) * BLOCK_E, R, E, D, BLOCK_E, BLOCK_K, INTERPRET)


@triton.jit
def _route_kernel(
    logits,
    bias,
    ids,
    weights,
    slots,
    n_slots,
    slot_w,
    slot_on,
    R,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE: tl.constexpr,
    NSLOT: tl.constexpr,
):
    route(logits, bias, ids, weights, slots, n_slots, slot_w, slot_on, R, E, BLOCK_E, TOPK, SCALE, NSLOT)


@triton.jit
def _act_kernel(
    x_hat,
    w_gate,
    w_up,
    act,
    slots,
    n_slots,
    shared_gate,
    shared_up,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Program (tile, slot)."""
    task_expert_act(
        x_hat,
        w_gate,
        w_up,
        shared_gate,
        shared_up,
        act,
        slots,
        n_slots,
        tl.program_id(1),
        tl.program_id(0) * BLOCK_N,
        R,
        I,
        D,
        NSLOT,
        BLOCK_N,
        BLOCK_K,
        LIMIT,
        INTERPRET,
    )


@triton.jit
def _down_kernel(
    act,
    w_down,
    y,
    slots,
    n_slots,
    shared_down,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    task_expert_down(
        act,
        w_down,
        shared_down,
        y,
        slots,
        n_slots,
        tl.program_id(1),
        tl.program_id(0) * BLOCK_N,
        R,
        I,
        D,
        NSLOT,
        BLOCK_N,
        BLOCK_K,
        INTERPRET,
    )


@triton.jit
def _sum_kernel(y, n_slots, slot_w, slot_on, out, D: tl.constexpr, NSLOT: tl.constexpr, CH: tl.constexpr):
    task_moe_sum(y, n_slots, slot_w, slot_on, out, tl.program_id(0), tl.program_id(1), D, NSLOT, CH)


def n_slots_for(rows: int, top_k: int) -> int:
    """Slots enough for the rows' distinct experts (at most rows x top_k), a power of two for the static loops."""
    return triton.next_power_of_2(rows * top_k)


def stack_experts(w, experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A rank's expert weights as three bf16 tensors, gate and up [E, I, D] and down [E, D, I], from the
    checkpoint's per-expert names (`experts.{e}.{gate,up,down}_proj.weight`): what the bodies index by expert."""
    return tuple(
        torch.stack([w[f"experts.{e}.{p}_proj.weight"] for e in range(experts)]).to(torch.bfloat16).contiguous()
        for p in ("gate", "up", "down")
    )


def moe_launch(x_hat: torch.Tensor, w, spec, block_n: int = 16, block_k: int = 64) -> dict[str, torch.Tensor]:
    """The MoE of one rank as plain launches: x̂ [R, D] bf16 and this rank's weights under the checkpoint's
    names (`gate.weight`, `gate.e_score_correction_bias`, `experts.{e}.*`, `shared_experts.*`). Returns out
    [R, D] fp32 (this rank's partial), ids and weights [R, top_k], and the slots."""
    R, D = x_hat.shape
    moe, dev = spec.moe, x_hat.device
    E, TOPK = moe.experts, moe.top_k
    wg, wu, wd = (t.to(dev) for t in stack_experts(w, E))
    I = wg.shape[1]
    NSLOT = n_slots_for(R, TOPK)
    f32 = dict(dtype=torch.float32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    logits = torch.zeros(16, E, **f32)
    ids, weights = torch.zeros(R, TOPK, **i32), torch.zeros(R, TOPK, **f32)
    slots, n_slots = torch.full((NSLOT,), -1, **i32), torch.zeros(1, **i32)
    slot_w, slot_on = torch.zeros(NSLOT, 16, **f32), torch.zeros(NSLOT, 16, **i32)
    act = torch.zeros(NSLOT + 1, 16, I, dtype=torch.bfloat16, device=dev)
    y = torch.zeros(NSLOT + 1, 16, D, **f32)
    out = torch.empty(R, D, **f32)
    x = x_hat.to(torch.bfloat16).contiguous()
    interp = interpreting()
    block_e = 32
    _router_kernel[(triton.cdiv(E, block_e),)](
        x,
        w["gate.weight"].to(torch.bfloat16).contiguous(),
        logits,
        R,
        E,
        D=D,
        BLOCK_E=block_e,
        BLOCK_K=min(block_k, D),
        INTERPRET=interp,
    )
    _route_kernel[(1,)](
        logits,
        w["gate.e_score_correction_bias"].float().contiguous(),
        ids,
        weights,
        slots,
        n_slots,
        slot_w,
        slot_on,
        R,
        E=E,
        BLOCK_E=triton.next_power_of_2(E),
        TOPK=TOPK,
        SCALE=moe.routed_scaling_factor,
        NSLOT=NSLOT,
    )
    sg, su, sd = (w[f"shared_experts.{p}_proj.weight"].to(torch.bfloat16).contiguous() for p in ("gate", "up", "down"))
    bn, bk = min(block_n, I), min(block_k, D)
    _act_kernel[(triton.cdiv(I, bn), NSLOT + 1)](
        x,
        wg,
        wu,
        act,
        slots,
        n_slots,
        sg,
        su,
        R,
        I=I,
        D=D,
        NSLOT=NSLOT,
        BLOCK_N=bn,
        BLOCK_K=bk,
        LIMIT=moe.swiglu_limit,
        INTERPRET=interp,
    )
    bn_d = min(block_n, D)
    _down_kernel[(triton.cdiv(D, bn_d), NSLOT + 1)](
        act,
        wd,
        y,
        slots,
        n_slots,
        sd,
        R,
        I=I,
        D=D,
        NSLOT=NSLOT,
        BLOCK_N=bn_d,
        BLOCK_K=min(block_k, I),
        INTERPRET=interp,
    )
    ch = min(128, D)
    _sum_kernel[(D // ch, R)](y, n_slots, slot_w, slot_on, out, D=D, NSLOT=NSLOT, CH=ch)
    return {"out": out, "ids": ids, "weights": weights, "slots": slots, "n_slots": n_slots}
