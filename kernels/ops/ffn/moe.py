"""The MoE as Triton bodies (docs/model.md §6.2): the router, the routing decided on the device, the touched
experts' clamped SwiGLU, and their sum in a fixed order. A kind's tasks call these bodies (the `kda` kind:
ops/ffn/layer_moe.py adds the hand-offs); `moe_launch` runs them as plain launches, one per step, for the tests.

The routing is decided where the rows are, with no host round trip and nothing that depends on timing:

- `router_tile` (experts e0.., K slice ks): the router's logits over the slice for every row, fp32 sums of
  bf16 products; `route_row` adds the slices in slice order.
- `route_row` (row r): s = sigmoid(logits), the top-k of s + bias by score descending then index ascending
  (exact ties by index), the weights s / (Σ s + 1e-20) × scale from the unbiased scores; the row's experts
  ascending, and which it chose (`on`).
- `decided_slot_expert` (slot j): the slot's expert decided again where it is needed, from the logits, by the
  same picks (knob route=each: a routed expert's gate/up starts from the router, not from the routing's hand-off).
- `make_slots` (once every row is routed): the experts any row chose, in ascending order, as slots: slot j is
  expert `slots[j]`, `n_slots[0]` of them, and `slot_of[e]` the slot of expert e. A touched expert's weights
  are then read once for all the rows that chose it, and an expert nobody chose is not read at all.
- `expert_gate_up` (slot, rows n0.. of its intermediate, K slice): gate and up in one K loop; `store_act` the
  clamped SwiGLU, stored bf16 (what the down projection reads); `task_expert_down` (slot, output columns n0..):
  its down projection, fp32. The shared expert is one more slot (NSLOT), always on, weight 1: it is stacked
  after the routed experts, as expert E, so every slot reads one stacked tensor.
- `moe_sum_cols` (row, columns): the shared expert's output, then each expert the row chose in ascending
  order times its weight, in fp32: the reference's order, so the same bits whatever the grid or schedule.

Expert parallelism would plug in at the slots: a rank holding whole experts runs the slots whose expert it
owns (all columns of it) and publishes its partial sum as TP mode does; the reduce across ranks is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.kernel import swiglu_act
from glm53ctl.kernels.ops.gemv.kernel import gemv_tile, gemv_tile_pair
from glm53ctl.kernels.tlx import interpreting, pinned, to_bf16

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.ops.ffn.moe"

# the router's experts per tile, and its K slices: short K loops, so its tiles on the path finish sooner
ROUTER_TILE = 32
ROUTER_SLICES = 4


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def router_tile(
    x_hat,
    w_r,
    logits,
    e0,
    ks,
    R,
    E,
    D: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """logits[ks, r, e0:e0 + BLOCK_E] (fp32, [KS, 16, E]) = x̂[r] · W_r[e] over K slice ks of KS, for every
    row r: x̂ [R, D] bf16, W_r [E, D] bf16."""
    KK: tl.constexpr = D // KS
    acc = gemv_tile(x_hat + ks * KK, D, w_r + ks * KK, e0, R, E, KK, D, BLOCK_E, BLOCK_K, INTERPRET)
    o_m = tl.arange(0, 16)
    o_e = e0 + tl.arange(0, BLOCK_E)
    tl.store(logits + (ks * 16 + o_m[:, None]) * E + o_e[None, :], acc, mask=(o_m[:, None] < R) & (o_e[None, :] < E))


@triton.jit
def topk_row(s, key, E: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr, SCALE: tl.constexpr):
    """A row's routing over the experts [BLOCK_E] from its scores s and keys (s + bias, -inf past E): which it
    chooses (1/0) and their weights (0 elsewhere). The top-k by key descending, then index ascending (an exact
    tie goes to the lower index); the weights from the unbiased s, normalized, times SCALE.

    One reduction per pick: the key's float order as an int32 (a key is s + bias with s > 0, never -0.0) in the
    high word, the index reversed in the low one, so the largest packed value is the largest key at its lowest
    index."""
    o_e = tl.arange(0, BLOCK_E)
    bits = key.to(tl.int32, bitcast=True)
    order = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    # past E: below every key, NaN included, so an id out of range can never be chosen
    order = tl.where(o_e < E, order, -(2**31))
    packed = (order.to(tl.int64) << 32) | (BLOCK_E - 1 - o_e).to(tl.int64)
    taken = tl.full((BLOCK_E,), -(2**63), tl.int64)
    chosen = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for _ in tl.static_range(TOPK):
        pick = BLOCK_E - 1 - (tl.max(packed, axis=0) & 0xFFFFFFFF).to(tl.int32)
        chosen = tl.where(o_e == pick, 1, chosen)
        packed = tl.where(o_e == pick, taken, packed)
    s_chosen = tl.where(chosen == 1, s, 0.0)
    return chosen, s_chosen / (tl.sum(s_chosen, axis=0) + 1e-20) * SCALE


@triton.jit
def row_keys(logits, bias, r, E: tl.constexpr, KS: tl.constexpr, BLOCK_E: tl.constexpr):
    """Row r's scores s = sigmoid(logits) from the router's K-slice sums [KS, 16, E] (added in slice order) and its
    keys s + bias (-inf past E), over [BLOCK_E]: what `route_row` and `decided_slot_expert` route by."""
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    lg = tl.load(logits + r * E + o_e, mask=m_e, other=0.0)
    for q in tl.static_range(1, KS):
        lg += tl.load(logits + (q * 16 + r) * E + o_e, mask=m_e, other=0.0)
    s = tl.sigmoid(lg)
    return s, tl.where(m_e, s + tl.load(bias + o_e, mask=m_e, other=0.0), float("-inf"))


@triton.jit
def route_row(
    logits,
    bias,
    ids,
    weights,
    on,
    r,
    E: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE: tl.constexpr,
):
    """Row r's routing from the router's K-slice sums logits [KS, 16, E] fp32 (added in slice order) and the
    bias [E] fp32: ids[r] (ascending) int32 and weights[r] fp32 [R, TOPK]; on[r, e] int32 [16, E]: whether row
    r chose expert e (what `make_slots` unites)."""
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    s, key = row_keys(logits, bias, r, E, KS, BLOCK_E)
    chosen, w = topk_row(s, key, E, BLOCK_E, TOPK, SCALE)
    # ascending expert order: a chosen expert's place is the count of chosen experts before it
    place = tl.cumsum(chosen, axis=0) - 1
    tl.store(ids + r * TOPK + place, o_e, mask=chosen == 1)
    tl.store(weights + r * TOPK + place, w, mask=chosen == 1)
    tl.store(on + r * E + o_e, chosen, mask=m_e)


@triton.jit
def make_slots(on, slots, n_slots, slot_of, R, E: tl.constexpr, BLOCK_E: tl.constexpr, NSLOT: tl.constexpr):
    """The slots from every row's `on` [16, E] (rows past R unread): slots [NSLOT] int32 (the chosen experts
    ascending, -1 past n_slots[0]) and slot_of [E] int32 (an expert's slot, -1 if nobody chose it). Reads the
    other rows' `on` from L2 (.cg): other programs wrote them."""
    o_m = tl.arange(0, 16)
    o_e = tl.arange(0, BLOCK_E)
    m = (o_m[:, None] < R) & (o_e[None, :] < E)
    touched = tl.max(tl.load(on + o_m[:, None] * E + o_e[None, :], mask=m, other=0, cache_modifier=".cg"), axis=0)
    slot = tl.cumsum(touched, axis=0) - 1
    n = tl.sum(touched, axis=0)
    o_j = tl.arange(0, NSLOT)
    tl.store(slots + o_j, tl.full((NSLOT,), -1, tl.int32), mask=o_j >= n)
    tl.store(slots + slot, o_e, mask=touched == 1)
    tl.store(slot_of + o_e, tl.where(touched == 1, slot, -1), mask=o_e < E)
    tl.store(n_slots + tl.arange(0, 1), tl.full((1,), 0, tl.int32) + n)


@triton.jit
def slot_expert(slots, n_slots, j, E: tl.constexpr, NSLOT: tl.constexpr):
    """Slot j's expert in the stacked weights (the shared expert, E, for slot NSLOT) and whether it runs: a
    routed slot past the experts chosen is skipped, so an expert nobody chose is never read."""
    shared = j == NSLOT
    # the shared slot's tasks wait on no routing: they read none of it
    live = shared | (j < tl.load(n_slots, mask=~shared, other=0))
    return tl.where(shared, E, tl.load(slots + tl.minimum(j, NSLOT - 1), mask=~shared, other=0)), live


@triton.jit
def decided_slot_expert(
    logits,
    bias,
    j,
    R,
    E: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE: tl.constexpr,
):
    """Routed slot j's expert and whether it runs, decided here from the router's logits as `route_row` and
    `make_slots` decide it (every row's top-k, their union ascending): a task that needs only its slot's expert
    reads it this way instead of waiting for the routing's hand-off (knob route=each). The same picks, so the
    same expert, bit for bit."""
    o_e = tl.arange(0, BLOCK_E)
    touched = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for r in range(R):
        s, key = row_keys(logits, bias, r, E, KS, BLOCK_E)
        chosen, _ = topk_row(s, key, E, BLOCK_E, TOPK, SCALE)
        touched = tl.maximum(touched, chosen)
    slot = tl.cumsum(touched, axis=0) - 1
    expert = tl.sum(tl.where((touched == 1) & (slot == j), o_e, 0), axis=0)
    return expert, j < tl.sum(touched, axis=0)


@triton.jit
def expert_gate_up(
    x_hat,
    w_gate,
    w_up,
    expert,
    n0,
    ks,
    R,
    I: tl.constexpr,
    D: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Expert `expert`'s gate and up rows n0.. over K slice ks of KS, for every row, in one K loop ([16, BLOCK_N]
    fp32 each): w_gate, w_up [E + 1, I, D] bf16 (this rank's share of every expert's intermediate)."""
    KK: tl.constexpr = D // KS
    base = expert.to(tl.int64) * I * D + ks * KK
    return gemv_tile_pair(x_hat + ks * KK, D, w_gate + base, w_up + base, n0, R, I, KK, D, BLOCK_N, BLOCK_K, INTERPRET)


@triton.jit
def store_act(g, u, act, n0, R, I: tl.constexpr, BLOCK_N: tl.constexpr, LIMIT: tl.constexpr, INTERPRET: tl.constexpr):
    """act[r, n0:n0 + BLOCK_N] (bf16, [16, I]) = the clamped SwiGLU of a slot's gate and up sums."""
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(
        act + o_m[:, None] * I + o_n[None, :],
        to_bf16(swiglu_act(g, u, LIMIT), INTERPRET),
        mask=(o_m[:, None] < R) & (o_n[None, :] < I),
    )


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_expert_down(
    act,
    w_down,
    y,
    slots,
    n_slots,
    j,
    n0,
    R,
    E: tl.constexpr,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """EXP_DOWN (slot j, output columns n0..): y[j, r, n0:n0 + BLOCK_N] (fp32, [NSLOT + 1, 16, D]) = the slot's
    down projection of act [NSLOT + 1, 16, I] bf16: w_down [E + 1, D, I] bf16."""
    expert, live = slot_expert(slots, n_slots, j, E, NSLOT)
    if live:
        w = w_down + expert.to(tl.int64) * D * I
        acc = gemv_tile(act + j * 16 * I, I, w, n0, R, D, I, I, BLOCK_N, BLOCK_K, INTERPRET)
        o_m = tl.arange(0, 16)
        o_n = n0 + tl.arange(0, BLOCK_N)
        tl.store(y + (j * 16 + o_m[:, None]) * D + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < D))


@triton.jit
def moe_sum_cols(y, ids, weights, slot_of, r, o_c, D: tl.constexpr, TOPK: tl.constexpr, NSLOT: tl.constexpr):
    """Row r's MoE output over columns o_c (this rank's partial, fp32): the shared expert's (slot NSLOT of y
    [NSLOT + 1, 16, D]), then each expert the row chose, in ascending order, times its weight: the reference's
    order."""
    acc = tl.load(y + (NSLOT * 16 + r) * D + o_c)
    for k in tl.static_range(TOPK):
        j = tl.load(slot_of + tl.load(ids + r * TOPK + k))
        acc = acc + tl.load(weights + r * TOPK + k) * tl.load(y + (j * 16 + r) * D + o_c)
    return acc


# ---- plain launches, one per step, of the bodies above (tests; a kind runs them as tasks)


@triton.jit
def _router_kernel(
    x_hat,
    w_r,
    logits,
    R,
    E,
    D: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Program (tile, K slice)."""
    router_tile(
        x_hat, w_r, logits, tl.program_id(0) * BLOCK_E, tl.program_id(1), R, E, D, KS, BLOCK_E, BLOCK_K, INTERPRET
    )


@triton.jit
def _route_kernel(
    logits,
    bias,
    ids,
    weights,
    on,
    E: tl.constexpr,
    KS: tl.constexpr,
    BLOCK_E: tl.constexpr,
    TOPK: tl.constexpr,
    SCALE: tl.constexpr,
):
    """Program r: row r."""
    route_row(logits, bias, ids, weights, on, tl.program_id(0), E, KS, BLOCK_E, TOPK, SCALE)


@triton.jit
def _slots_kernel(on, slots, n_slots, slot_of, R, E: tl.constexpr, BLOCK_E: tl.constexpr, NSLOT: tl.constexpr):
    make_slots(on, slots, n_slots, slot_of, R, E, BLOCK_E, NSLOT)


@triton.jit
def _act_kernel(
    x_hat,
    w_gate,
    w_up,
    act,
    slots,
    n_slots,
    R,
    E: tl.constexpr,
    I: tl.constexpr,
    D: tl.constexpr,
    NSLOT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Program (tile, slot): one K slice."""
    j, n0 = tl.program_id(1), tl.program_id(0) * BLOCK_N
    expert, live = slot_expert(slots, n_slots, j, E, NSLOT)
    if live:
        g, u = expert_gate_up(x_hat, w_gate, w_up, expert, n0, 0, R, I, D, 1, BLOCK_N, BLOCK_K, INTERPRET)
        store_act(g, u, act + j * 16 * I, n0, R, I, BLOCK_N, LIMIT, INTERPRET)


@triton.jit
def _down_kernel(
    act,
    w_down,
    y,
    slots,
    n_slots,
    R,
    E: tl.constexpr,
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
        y,
        slots,
        n_slots,
        tl.program_id(1),
        tl.program_id(0) * BLOCK_N,
        R,
        E,
        I,
        D,
        NSLOT,
        BLOCK_N,
        BLOCK_K,
        INTERPRET,
    )


@triton.jit
def _sum_kernel(
    y, ids, weights, slot_of, out, D: tl.constexpr, TOPK: tl.constexpr, NSLOT: tl.constexpr, CH: tl.constexpr
):
    """Program (chunk, row)."""
    r = tl.program_id(1)
    o_c = tl.program_id(0) * CH + tl.arange(0, CH)
    tl.store(out + r * D + o_c, moe_sum_cols(y, ids, weights, slot_of, r, o_c, D, TOPK, NSLOT))


def n_slots_for(rows: int, top_k: int) -> int:
    """Slots enough for the rows' distinct experts (at most rows x top_k), a power of two for the static loops."""
    return triton.next_power_of_2(rows * top_k)


def stack_experts(w, experts: int, shared: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A rank's expert weights as three bf16 tensors, gate and up [E, I, D] and down [E, D, I], from the
    checkpoint's per-expert names (`experts.{e}.{gate,up,down}_proj.weight`): what the bodies index by expert.
    shared: the shared expert (`shared_experts.*`) stacked after them, as expert E ([E + 1, ...])."""
    names = [f"experts.{e}." for e in range(experts)] + (["shared_experts."] if shared else [])
    return tuple(
        torch.stack([w[f"{n}{p}_proj.weight"] for n in names]).to(torch.bfloat16).contiguous()
        for p in ("gate", "up", "down")
    )


def route_runner(logits: torch.Tensor, bias: torch.Tensor, spec, rows: int, into: tuple | None = None) -> Callable:
    """The routing of `rows` rows from the router's logits [KS, 16, E] (its K slices' partial sums) and the
    correction bias [E], a program a row, made once and launched at each call into the same buffers (`into`:
    ids [R, top_k], weights [R, top_k] and the experts' marks `on` [16, E], zeros; made here where not given):
    what `moe_launch` runs and `bench --op route` times. Returns (ids, weights, on)."""
    moe, dev = spec.moe, logits.device
    E, TOPK, KS = moe.experts, moe.top_k, logits.shape[0]
    if into is None:
        i32, f32 = dict(dtype=torch.int32, device=dev), dict(dtype=torch.float32, device=dev)
        into = (torch.zeros(rows, TOPK, **i32), torch.zeros(rows, TOPK, **f32), torch.zeros(16, E, **i32))
    ids, weights, on = into
    consts = dict(E=E, KS=KS, BLOCK_E=triton.next_power_of_2(E), TOPK=TOPK, SCALE=moe.routed_scaling_factor)

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        _route_kernel[(rows,)](logits, bias, ids, weights, on, **consts)
        return ids, weights, on

    return run


def moe_launch(x_hat: torch.Tensor, w, spec, block_n: int = 16, block_k: int = 64) -> dict[str, torch.Tensor]:
    """The MoE of one rank as plain launches: x̂ [R, D] bf16 and this rank's weights under the checkpoint's
    names (`gate.weight`, `gate.e_score_correction_bias`, `experts.{e}.*`, `shared_experts.*`). Returns out
    [R, D] fp32 (this rank's partial), ids and weights [R, top_k], and the slots."""
    R, D = x_hat.shape
    moe, dev = spec.moe, x_hat.device
    E, TOPK = moe.experts, moe.top_k
    wg, wu, wd = (t.to(dev) for t in stack_experts(w, E, shared=True))
    I = wg.shape[1]
    NSLOT = n_slots_for(R, TOPK)
    KS = ROUTER_SLICES if D % ROUTER_SLICES == 0 and D // ROUTER_SLICES >= 16 else 1
    f32 = dict(dtype=torch.float32, device=dev)
    i32 = dict(dtype=torch.int32, device=dev)
    logits = torch.zeros(KS, 16, E, **f32)
    ids, weights = torch.zeros(R, TOPK, **i32), torch.zeros(R, TOPK, **f32)
    on = torch.zeros(16, E, **i32)
    slots, n_slots, slot_of = torch.full((NSLOT,), -1, **i32), torch.zeros(1, **i32), torch.zeros(E, **i32)
    act = torch.zeros(NSLOT + 1, 16, I, dtype=torch.bfloat16, device=dev)
    y = torch.zeros(NSLOT + 1, 16, D, **f32)
    out = torch.empty(R, D, **f32)
    x = x_hat.to(torch.bfloat16).contiguous()
    interp = interpreting()
    block_e = triton.next_power_of_2(E)
    _router_kernel[(triton.cdiv(E, ROUTER_TILE), KS)](
        x,
        w["gate.weight"].to(torch.bfloat16).contiguous(),
        logits,
        R,
        E,
        D=D,
        KS=KS,
        BLOCK_E=ROUTER_TILE,
        BLOCK_K=min(block_k, D // KS),
        INTERPRET=interp,
    )
    bias = w["gate.e_score_correction_bias"].float().contiguous()
    route_runner(logits, bias, spec, R, (ids, weights, on))()
    _slots_kernel[(1,)](on, slots, n_slots, slot_of, R, E=E, BLOCK_E=block_e, NSLOT=NSLOT)
    bn, bk = min(block_n, I), min(block_k, D)
    lim = moe.swiglu_limit
    _act_kernel[(triton.cdiv(I, bn), NSLOT + 1)](
        x,
        wg,
        wu,
        act,
        slots,
        n_slots,
        R,
        E=E,
        I=I,
        D=D,
        NSLOT=NSLOT,
        BLOCK_N=bn,
        BLOCK_K=bk,
        LIMIT=lim,
        INTERPRET=interp,
    )
    bn_d = min(block_n, D)
    _down_kernel[(triton.cdiv(D, bn_d), NSLOT + 1)](
        act,
        wd,
        y,
        slots,
        n_slots,
        R,
        E=E,
        I=I,
        D=D,
        NSLOT=NSLOT,
        BLOCK_N=bn_d,
        BLOCK_K=min(block_k, I),
        INTERPRET=interp,
    )
    ch = min(128, D)
    _sum_kernel[(D // ch, R)](y, ids, weights, slot_of, out, D=D, TOPK=TOPK, NSLOT=NSLOT, CH=ch)
    return {"out": out, "ids": ids, "weights": weights, "slots": slots, "n_slots": n_slots}
