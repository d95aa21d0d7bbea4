"""The `dense` kind's task table: one KDA layer with the dense MLP (layers 0-2), and its shapes and tiles.

Tasks, in table order (a rank's shapes; every GEMV is `gemv_tile` over rows padded to 16):

  MIX_A   a column chunk of one row's attention-gate mix logits (fn @ H), sum of squares and Gram matrix
  GATE_A  (row r, chunk c): hc_pre without the comb, from the chunks' partials (its RMS from their Gram
          matrices), and chunk c of x̂; chunk 0 also post, pre and 1/RMS        waits on its row's MIX_A
  COMB_A  row r: the Sinkhorn comb (for hc_post; several µs: kept off the in-projection's path)  the same
  INPROJ  (tile, K slice) of the fused in-projection f_a | g_a | b | (q_h | k_h | v_h per head) (knob
          ksplit_in); slice 0 adds the slices' sums (late)                    waits on GATE_A
          (`norm fold`: streams H's stream rows and waits late on each row's GATE_A chunk 0)
  KDA_HEAD (head h, row r, part p): f_b and g_b for the head, conv with its state, safe gate, the delta rule
          on the part's value columns (knob kda_split, `kda_parts`: 1, 2 or 4 parts); the head's last part
          to arrive makes z, the gated RMSNorm                 waits on the INPROJ tiles it reads
  OPROJ   a tile of o_proj over a K slice (ks): this rank's partial
                                                                waits on every part of the slice's heads
  RED_A   a column chunk of one row: the partials summed in rank order (attn), hc_post (H1), and (no MIX_F)
          the FFN gate's mix logits over the chunk  waits on its row's COMB_A, its OPROJ tiles and the peers
  MIX_F   (knob `ffn_mix`, `mix_tasks`) the FFN gate's mix logits over a chunk, as its own task: RED_A then
          leaves them out, so gate/up's stream starts sooner                  waits on its chunk's RED_A
  GATE_F  (row r, chunk c): the FFN gate on H1 (x̂'s chunk; chunk 0 post)   waits on its row's RED_A (or MIX_F)
  COMB_F  row r: its comb                                                the same
  GU      (tile, K slice) of gate and up (knob ksplit_gu); slice 0 adds the slices' sums (late) and makes
          the clamped SwiGLU: act                                             waits on every GATE_F
          (`norm fold`: streams H1's stream rows, waits on every RED_A, and late on every GATE_F)
  DOWN    a tile of down_proj over a K slice: this rank's partial         waits on the slice's GU tiles
  RED_F   a column chunk of one row: the partials summed in rank order (ffn.out), hc_post (H)
          waits on its row's COMB_F, its DOWN tiles and the peers

`kda` (ffn "moe", `_add_moe`) has the MoE instead of GU / DOWN:

  ROUTER  (32 experts, K slice) the router's logits over the slice, every row         waits on every GATE_F
  ROUTE   row r: its top-k and weights; the last row to arrive makes the slots          waits on every ROUTER
  EXP_GU  (slot, tile, K slice) an expert's gate/up (knob ksplit_gu); slice 0 adds the slices (late) and makes
          the slot's act; the shared expert's slot (the last) waits on the FFN gates only, so streams during
          the routing; a slot past the experts chosen does nothing                     waits on every ROUTE
          (knob route=each: decides its slot's expert from the logits itself, and waits on every ROUTER)
  EXP_DOWN (slot, tile of block_n_down rows) the slot's down projection         waits on the slot's EXP_GU
          (route=each: a routed slot's also on every ROUTE, in a site of its own)
  RED_F   as above, summing the shared expert and the row's experts in ascending order as its own partial
          waits on its row's COMB_F, the EXP_DOWN tiles of every slot covering it and the peers

The in-projection rows are laid out per head (q_h | k_h | v_h) after the small f_a | g_a | b rows, so a
KDA task waits only on the tiles of its own head. OWN_A / OWN_F replace RED_A / RED_F in a peer's partial
launch (mode "attn" / "ffn"): they write this rank's partial (its K slices summed in order) for the others;
with no hc_post after them, such a launch has no COMB_A ("attn") or COMB_F (both).
"""

from __future__ import annotations

import math

from glm53ctl.kernels.kinds.base import KnobRecord
from glm53ctl.kernels.ops.dsa import tasks as dsa
from glm53ctl.kernels.ops.dsa.select import select_dims
from glm53ctl.kernels.ops.ffn import tasks as ffn
from glm53ctl.kernels.ops.ffn.moe import ROUTER_SLICES, ROUTER_TILE, n_slots_for
from glm53ctl.kernels.ops.gemv.kernel import folds
from glm53ctl.kernels.ops.gemv.tasks import OPROJ, OProj
from glm53ctl.kernels.ops.kda.tasks import INPROJ, KDA_HEAD, InProj, KdaHead
from glm53ctl.kernels.ops.mhc import tasks as mhc
from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.runtime.tasks import Task

MODES = ("full", "attn", "ffn")
# the stages of the separate-launches baseline: a gate and its comb, independent of each other, are one stage,
# and so are the attention reduces and the FFN mix tasks after them (10 launches with or without mix tasks)
STAGES = (
    (mhc.MIX_A,),
    (mhc.GATE_A, mhc.COMB_A),
    (INPROJ,),
    (KDA_HEAD,),
    (OPROJ,),
    (mhc.RED_A, mhc.MIX_F),
    (mhc.GATE_F, mhc.COMB_F),
    (ffn.GU,),
)
STAGES += ((ffn.DOWN,), (mhc.RED_F,))
# kda: the attention half's, then the MoE's (router tiles; the routing; every slot's gate/up, the shared expert's
# included; their down projections; the sums)
MOE_STAGES = STAGES[:7] + ((ffn.ROUTER,), (ffn.ROUTE,), (ffn.EXP_GU,), (ffn.EXP_DOWN,), (mhc.RED_F,))


def route_stages(stages: tuple, knobs: KnobRecord) -> tuple:
    """A MoE layer's stages at knob `route`: with `each` no gate/up waits on the routing, so the routing runs in
    the gate/up's stage launch (one launch fewer on the path); with `task` as given."""
    if knobs.route != "each":
        return stages
    return tuple((ffn.ROUTE, *s) if ffn.EXP_GU in s and ffn.ROUTE not in s else s for s in stages if s != (ffn.ROUTE,))


def down_stages(stages: tuple, knobs: KnobRecord) -> tuple:
    """A MoE layer's stages at knob `down_stage`: with `gate_up` the experts' down projections run in the gate/up's
    stage launch (after its tasks, whose flags they wait on there: a stage's programs are its tasks in table
    order); with `own` as given."""
    if knobs.down_stage != "gate_up":
        return stages
    return tuple((*s, ffn.EXP_DOWN) if ffn.EXP_GU in s else s for s in stages if s != (ffn.EXP_DOWN,))


def push_stages(stages: tuple) -> tuple:
    """A stage schedule on real ranks: each all-reduce's pushes (OWN_A, OWN_F) in the stage of the tiles they
    push (o_proj's; the down projections', the experts' included), so the peers' words are out before the
    stage of the reduces that wait on them."""
    out = []
    for stage in stages:
        stage = tuple(stage)
        if OPROJ in stage:
            stage += (mhc.OWN_A,)
        if ffn.DOWN in stage or ffn.EXP_DOWN in stage:
            stage += (mhc.OWN_F,)
        out.append(stage)
    return tuple(out)


def _covering(tiles: list[tuple[int, int, int]], lo: int, hi: int) -> list[int]:
    """The tasks of tiles (lo, hi, task) that overlap [lo, hi)."""
    return [t for a, b, t in tiles if a < hi and lo < b]


def kda_parts(knob: int, heads: int, rows: int, grid: int) -> int:
    """A KDA head's parts: the knob's value, or (0) the most of 4, 2, 1 whose parts, heads x rows x parts, the
    grid's programs cover. Parts pay off only while programs would otherwise sit idle: each re-reads its head's
    f_b, g_b and conv rows (H200, when part 0 still waited for the others and made z: 285 µs at TP1 rows 8
    with 1 part, 325 with 4; 75 at TP8 rows 1 with 4, 81 with 1; the rule picked the fastest of 1, 2, 4 at all
    10 keys measured, docs/perf/dense.md)."""
    if knob:
        return knob
    return next((n for n in (4, 2) if heads * rows * n <= grid), 1)


def k_slices(knob: int, k: int) -> int:
    """A GEMV's K slices: the knob's value, or fewer where K is too narrow for slices of 16 and more."""
    n = knob
    while n > 1 and (k % n or k // n < 16):
        n //= 2
    return n


class Dims:
    """One rank's shapes of a KDA layer with the dense MLP (ffn "dense") or the MoE ("moe": I is an expert's
    intermediate share, and the FFN partial is one slice, the MoE sum), and the tile and slice sizes a key's
    knobs give them."""

    def __init__(self, spec, tp: int, knobs: KnobRecord, ffn: str = "dense", attn: str = "kda", slots: int = 4) -> None:
        sh = spec.shards(tp)
        self.moe, self.mla = ffn == "moe", attn == "mla"
        self.D, self.HC, self.iters = spec.hidden, spec.mhc.streams, spec.mhc.sinkhorn_iters
        self.HL, self.K, self.W, self.RG = sh.kda_heads, spec.kda.head_dim, spec.kda.conv_kernel, spec.kda.gate_rank
        self.P, self.I, self.T = self.HL * self.K, sh.expert_inter if self.moe else sh.dense_inter, tp
        if self.mla:
            self._mla(spec, sh, knobs, slots)
        self.E, self.TOPK, self.SCALE = spec.moe.experts, spec.moe.top_k, spec.moe.routed_scaling_factor
        self.NIN = 2 * self.RG + self.HL + 3 * self.P
        self.HDR = 2 * self.RG + self.HL
        # the reduce / mix column chunk (numeric: it sets the order of the gates' sums)
        self.CH = min(knobs.chunk_cols, self.D // 4)
        self.NCH = self.D // self.CH
        self.KS_O, self.KS_F = k_slices(knobs.ksplit, self.P), 1 if self.moe else k_slices(knobs.ksplit, self.I)
        self.KS_GU = k_slices(knobs.ksplit_gu, self.D)
        self.KS_IN = k_slices(knobs.ksplit_in, self.D)
        self.PK, self.IK = self.P // self.KS_O, self.I // self.KS_F
        self.BN, self.BN_GU, self.BN_O = knobs.block_n_in, knobs.block_n_gu, knobs.block_n_out
        bk = knobs.block_k
        self.BK_D, self.BK_R, self.BK_O, self.BK_I = (min(bk, n) for n in (self.D, self.RG, self.PK, self.IK))
        self.BK_GU = min(bk, self.D // self.KS_GU)
        self.BK_IN = min(bk, self.D // self.KS_IN)
        # the MoE: the router's K slices; an expert's down tile (knob block_n_down; 0: 64 rows, or 64 KB of
        # weights where that is more rows. H200, TP1 rows 8: 16 rows 1202 µs, 32 969, 64 889; docs/perf/kda.md)
        self.KS_RT = k_slices(ROUTER_SLICES, self.D)
        self.BK_RT = min(bk, self.D // self.KS_RT)
        self.BN_DN = knobs.get("block_n_down") or max(64, min(128, 32768 // self.I))
        if self.mla:
            self.BK_A, self.BK_QB, self.BK_C = min(bk, self.D), math.gcd(self.QL, bk), min(bk, self.C)
        # the GEMV body has no K mask: a K slice must be whole K tiles
        tiles = ((self.D // self.KS_GU, self.BK_GU), (self.D // self.KS_IN, self.BK_IN), (self.PK, self.BK_O))
        for k, tile in (*tiles, (self.D // self.KS_RT, self.BK_RT)):
            assert k % tile == 0, f"a K slice of {k} columns is not whole K tiles of {tile}"
        assert self.IK % self.BK_I == 0 and self.D % self.BK_D == 0 and self.RG % self.BK_R == 0

    def _mla(self, spec, sh, knobs: KnobRecord, slots: int) -> None:
        """`sparse`'s attention half (attn "mla"): the MLA heads of this rank, the replicated indexer, the caches'
        slots (whole pools), and the tiles: o_proj's K (P) is the heads' values."""
        m, ix = spec.mla, spec.indexer
        self.HQ, self.NOPE, self.V, self.C, self.QL = (
            sh.mla_heads,
            m.qk_nope_head_dim,
            m.v_head_dim,
            m.kv_lora_rank,
            m.q_lora_rank,
        )
        self.IH, self.HI, self.KP = ix.head_dim, ix.heads, ix.kpool
        self.WIDTH, self.TOPP = spec.index_width, spec.index_pools
        self.NA = self.QL + self.C + 2 * self.IH + self.HI  # q_a | kv_a | wk | pool gate | head weights
        self.NQB = self.HQ * self.NOPE + self.HI * self.IH  # q_b | the indexer's wq_b
        self.P = self.HQ * self.V
        self.LMAX = slots
        # pools per score task: 64 took 27.7 µs a task on the H200 (TP8 rows 1, 4K: 17 tasks on the path), its fp32
        # dot of 32 heads by 64 pools on the FMA units; 16 gives a row's pools 4x the programs
        self.BP = 16
        self.NSB = -(-(slots // self.KP) // self.BP)
        # the selection's sizes (kernels/ops/dsa/select.py): SEL.NQ_ROW parts of SEL.PART pools cover the caches'
        self.SEL = select_dims(slots // self.KP, passes=knobs.select_passes)
        self.TB = knobs.token_block  # tokens per attention task (numeric: the combine's order)
        self.NB = -(-self.WIDTH // self.TB)
        self.HB = max(16, min(64, 1 << (self.HQ - 1).bit_length()))  # heads per attention task, a tl.dot tile
        self.NBP = 1 << (self.NB - 1).bit_length()
        # latent columns per combine task: one program combining a row's whole [HB, C] took 28.7 µs at TP8 rows 1
        # (H200, 4K context); its tile is every block's [NBP, HB, CC] at once
        self.CC = min(8, self.C)
        self.BN_AB = min(64, self.C)  # latent columns per absorb task
        self.BN_UV = min(64, self.V)  # value rows per W_UV task


def mix_tasks(knobs: KnobRecord, rows: int, streams: int) -> bool:
    """Knob `ffn_mix`: whether the FFN gate's mix logits are tasks of their own. "auto": where gate/up folds
    the norm, so waits for the reduces' H1 alone and starts sooner; unfolded it waits for the FFN gates, which
    would then wait one hand-off more (H200, docs/perf/dense.md: TP8 rows 1 65.0 -> 62.3 µs,
    rows 8 83.7 -> 85.2)."""
    mode = knobs.ffn_mix
    return mode == "task" or (mode == "auto" and folds(knobs.norm, rows, streams))


def build_table(d: Dims, rows: int, knobs: KnobRecord, mode: str = "full", rank: int | None = None) -> TaskTable:
    """The tasks of one rank's launch in topological order. mode "attn": up to this rank's attention partial;
    "ffn": up to its FFN partial (given every rank's attention partial); "full": the whole layer. `rank` given
    (real ranks, mode "full"): the rank pushes both partials to its peers itself (`add_dense`'s `push`), and
    the peers' words are two groups, one per all-reduce, named by the peers' ranks."""
    kind = "kda" if d.moe else "dense"
    push = rank is not None and d.T > 1
    assert not push or mode == "full", "a real rank runs the whole layer"
    peers = 0 if mode == "attn" else (d.T - 1) * (2 if push else 1)
    t = TaskTable(kind, peers=peers, peer_group=d.T - 1 if push else 0)
    if push:
        t.peer_ranks = [q for q in range(d.T) if q != rank]
    add_dense(t, d, rows, knobs, mode, push=push)
    return t


def add_dense(
    t: TaskTable, d: Dims, rows: int, knobs: KnobRecord, mode: str = "full", after: list[int] = (), push: bool = False
) -> list[int]:
    """Append one rank's layer to `t`: its first tasks (the attention mix) wait on `after`, the tasks that
    produce its input H when the layer is part of a larger table. Returns the tasks that produce its output:
    H (the FFN reduces) in mode "full", the rank's partials (OWN_A / OWN_F) in "attn" / "ffn".

    `push` (real ranks): before each all-reduce's reduces, every chunk's OWN task pushes this rank's partial
    into every peer's mailbox (the last to finish tags it: group 0 the attention's, 1 the FFN's), and the
    reduces wait on the peers' tags of their group. Every push of a reduce comes before it in claim order, so
    ranks whose programs run one after another (the interpreter) never wait on each other in a circle."""
    assert mode in MODES
    how, words = knobs.handoff, knobs.box_words
    first = bool(knobs.get("weights_first", 0))  # o_proj's and down's waits in their bodies, after their weights

    def add(job: Task, waits: list[int] = (), peers: int | None = None, late: bool = False) -> int:
        """A task and its waits; `peers`: the group of peer words it also waits on (None: no peers)."""
        task = t.add(job)
        if waits:
            t.wait(task, sorted(set(waits)), how, words, late)
        if peers is not None and d.T > 1:
            t.wait_peers(task, peers if push else 0)
        return task

    mix = [[add(mhc.MixA(c, r), waits=list(after)) for c in range(d.NCH)] for r in range(rows)]
    # per row and column chunk: chunk 0 also makes pre and 1/RMS (all a folded GEMV needs), every chunk its x̂
    gate_rows = [[add(mhc.GateA(r, c), waits=mix[r]) for c in range(d.NCH)] for r in range(rows)]
    gates, gate_heads = [x for g in gate_rows for x in g], [g[0] for g in gate_rows]
    # the Sinkhorn comb: for hc_post in the attention reduces (none in a peer's "attn" launch), not the GEMVs
    combs = [add(mhc.CombA(r), waits=mix[r]) for r in range(rows)] if mode != "attn" else []
    # a folded INPROJ streams H from the start (once H is there) and waits for its gates at its end
    # (never MLA's A projection: the fold's one more bf16 rounding of its weights took sparse's attn.out to 6.8e-2
    # against the reference at glm53_flash's width, H200; docs/perf/spread.md)
    fold = folds(knobs.norm, rows, d.HC) and not d.mla
    if d.mla:
        oproj = _add_mla(t, add, d, rows, gates, first)
    else:
        inproj = []
        for n0 in range(0, d.NIN, d.BN):
            # K slices 1.. first (folded: nothing to wait for); slice 0 adds their sums (late) and stores the rows
            others = [add(InProj(n0, ks), waits=list(after) if fold else gates) for ks in range(d.KS_IN - 1, 0, -1)]
            inproj.append((n0, n0 + d.BN, add(InProj(n0, 0), waits=list(after) if fold else gates)))
            if others:
                t.wait(inproj[-1][2], others, how, words, late=True)
            if fold:
                t.wait(inproj[-1][2], gate_heads, how, words, late=True)
        small = _covering(inproj, 0, 2 * d.RG)  # f_a | g_a: every head's low-rank rows
        nv = kda_parts(knobs.kda_split, d.HL, rows, knobs.grid)
        heads = []
        for h in range(d.HL):
            own = small + _covering(inproj, 2 * d.RG + h, 2 * d.RG + h + 1)
            own += _covering(inproj, d.HDR + 3 * d.K * h, d.HDR + 3 * d.K * (h + 1))
            heads.append([add(KdaHead(h, r, p), waits=own) for r in range(rows) for p in range(nv)])
        oproj = []
        for ks in range(d.KS_O):
            lo, hi = ks * d.PK, (ks + 1) * d.PK
            need = [task for h in range(d.HL) if h * d.K < hi and lo < (h + 1) * d.K for task in heads[h]]
            oproj += [(n0, n0 + d.BN_O, add(OProj(n0, ks), waits=need, late=first)) for n0 in range(0, d.D, d.BN_O)]
    chunks = [(c, r) for r in range(rows) for c in range(d.NCH)]  # row by row: row 0's gate goes first
    if mode == "attn":
        return [add(mhc.OwnA(c, r), waits=_covering(oproj, c * d.CH, (c + 1) * d.CH)) for c, r in chunks]
    if push:
        for c, r in chunks:
            add(mhc.OwnA(c, r), waits=_covering(oproj, c * d.CH, (c + 1) * d.CH))
    reds = [
        add(mhc.ReduceA(c, r), waits=[combs[r], *_covering(oproj, c * d.CH, (c + 1) * d.CH)], peers=0)
        for c, r in chunks
    ]
    mixes = reds  # the tasks that make the FFN gate's mix logits
    if mix_tasks(knobs, rows, d.HC):
        mixes = [add(mhc.MixF(c, r), waits=[red]) for (c, r), red in zip(chunks, reds, strict=True)]
    gate_rows = [
        [add(mhc.GateF(r, c), waits=mixes[r * d.NCH : (r + 1) * d.NCH]) for c in range(d.NCH)] for r in range(rows)
    ]
    gates_f, gate_heads = [x for g in gate_rows for x in g], [g[0] for g in gate_rows]
    combs_f = (
        [add(mhc.CombF(r), waits=mixes[r * d.NCH : (r + 1) * d.NCH]) for r in range(rows)] if mode == "full" else []
    )
    if d.moe:  # the reduces sum the slots' outputs themselves (their own partial is the MoE's sum)
        slots = _add_moe(t, add, d, rows, gates_f, knobs)
        cover = lambda c: [x for down in slots for x in _covering(down, c * d.CH, (c + 1) * d.CH)]  # noqa: E731
        if mode == "ffn" or push:
            owns = [add(mhc.OwnF(c, r), waits=cover(c)) for c, r in chunks]
            if mode == "ffn":
                return owns
        return [add(mhc.ReduceF(c, r), waits=[combs_f[r], *cover(c)], peers=1) for c, r in chunks]
    # folded, gate/up streams H1 (written by the reduces) and waits for the FFN gates at its end
    gu = []
    for n0 in range(0, d.I, d.BN_GU):
        # K slices 1.. first; slice 0 adds their sums (late) and makes act
        need = reds if fold else gates_f
        others = [add(ffn.GateUp(n0, ks), waits=need) for ks in range(d.KS_GU - 1, 0, -1)]
        gu.append((n0, n0 + d.BN_GU, add(ffn.GateUp(n0, 0), waits=need)))
        if others:
            t.wait(gu[-1][2], others, how, words, late=True)
        if fold:
            t.wait(gu[-1][2], gate_heads, how, words, late=True)
    down = []
    for ks in range(d.KS_F):
        need = _covering(gu, ks * d.IK, (ks + 1) * d.IK)
        down += [(n0, n0 + d.BN_O, add(ffn.Down(n0, ks), waits=need, late=first)) for n0 in range(0, d.D, d.BN_O)]
    if mode == "ffn" or push:
        owns = [add(mhc.OwnF(c, r), waits=_covering(down, c * d.CH, (c + 1) * d.CH)) for c, r in chunks]
        if mode == "ffn":
            return owns
    return [
        add(mhc.ReduceF(c, r), waits=[combs_f[r], *_covering(down, c * d.CH, (c + 1) * d.CH)], peers=1)
        for c, r in chunks
    ]


def _add_moe(t: TaskTable, add, d: Dims, rows: int, gates_f: list[int], knobs: KnobRecord) -> list[list[tuple]]:
    """The MoE after the FFN gates: router tiles over K slices (every row's logits), the routing (a task per row;
    the last to arrive makes the slots), then per slot (the shared expert's first: it needs no routing, so it
    streams while the router and routing run; then one slot per expert the rows may choose, skipped past those
    chosen) its gate/up tiles over K slices (slice 0 adds the others' sums, late, and makes act) and its down
    tiles. Returns each slot's down tiles (lo, hi, task): the FFN reduce of a chunk sums the slots covering it."""
    how, words = knobs.handoff, knobs.box_words
    nslot = n_slots_for(rows, d.TOPK)
    router = [add(ffn.Router(e0, ks), waits=gates_f) for e0 in range(0, d.E, ROUTER_TILE) for ks in range(d.KS_RT)]

    def gate_up(j: int, after: list[int]) -> list[tuple[int, int, int]]:
        tiles = []
        for n0 in range(0, d.I, d.BN_GU):
            others = [add(ffn.ExpertGateUp(j, n0, ks), waits=after) for ks in range(d.KS_GU - 1, 0, -1)]
            tiles.append((n0, n0 + d.BN_GU, add(ffn.ExpertGateUp(j, n0, 0), waits=after)))
            if others:
                t.wait(tiles[-1][2], others, how, words, late=True)
        return tiles

    order = [nslot, *range(nslot)]  # the shared expert is slot nslot
    gu = {nslot: gate_up(nslot, gates_f)}
    routes = [add(ffn.Route(r), waits=router) for r in range(rows)]
    each = knobs.route == "each"  # a routed gate/up decides its expert itself: it waits on the router alone
    for j in range(nslot):
        gu[j] = gate_up(j, router if each else routes)

    def down(j: int, n0: int) -> int:
        task = add(ffn.ExpertDown(j, n0), waits=[x for *_, x in gu[j]])
        if each and j != nslot:  # it reads the slots (and the reduces after it the routing): a site of its own
            t.wait(task, routes, how, words)
        return task

    return [[(n0, n0 + d.BN_DN, down(j, n0)) for n0 in range(0, d.D, d.BN_DN)] for j in order]


def _add_mla(
    t: TaskTable, add, d: Dims, rows: int, gates: list[int], first: bool = False
) -> list[tuple[int, int, int]]:
    """`sparse`'s attention half after the attention gates (kernels/ops/dsa/kernel.py has the steps): the fused A
    projection's tiles; per row q_a's norm, then its cache writes and head weights; q_b | the indexer's wq_b
    tiles; per head the absorb; per row the index scores in pool blocks, then its selection over parts of the pools
    (four passes, then each part's tokens; knob select_passes: fewer passes, or none); per row,
    head group and token block the attention partials, then per row, group and latent column chunk their combine;
    per head W_UV; o_proj. Returns the o_proj tiles."""
    a_tiles = [(n0, n0 + d.BN, add(dsa.MlaA(n0), waits=gates)) for n0 in range(0, d.NA, d.BN)]
    # per row two parts: q_a's norm (what q_b waits for), then the caches' writes and head weights (the scores')
    q_rows = [add(dsa.MlaRow(r, 0), waits=_covering(a_tiles, 0, d.QL)) for r in range(rows)]
    row_tasks = [add(dsa.MlaRow(r, 1), waits=_covering(a_tiles, d.QL, d.NA)) for r in range(rows)]
    qb = [(n0, n0 + d.BN, add(dsa.MlaQb(n0), waits=q_rows)) for n0 in range(0, d.NQB, d.BN)]
    absorb = [
        [add(dsa.Absorb(h, c0), waits=_covering(qb, h * d.NOPE, (h + 1) * d.NOPE)) for c0 in range(0, d.C, d.BN_AB)]
        for h in range(d.HQ)
    ]
    qi = _covering(qb, d.HQ * d.NOPE, d.NQB)
    selects = []
    for r in range(rows):
        scores = [(b * d.BP, (b + 1) * d.BP, add(dsa.Score(r, b), waits=[row_tasks[r], *qi])) for b in range(d.NSB)]
        # the selection over parts of the pools: pass 0 of a part waits on its scores, pass i on every part's
        # pass i - 1, the tokens of each part on every part's last pass (knob select_passes: SEL.PASSES of the
        # four; with none, on every score of the row)
        parts = range(d.SEL.NQ_ROW)
        sel = [x for *_, x in scores]
        if d.SEL.PASSES:
            sel = [
                add(dsa.SelectPass(r, 0, q), waits=_covering(scores, q * d.SEL.PART, (q + 1) * d.SEL.PART))
                for q in parts
            ]
        for i in range(1, d.SEL.PASSES):
            sel = [add(dsa.SelectPass(r, i, q), waits=sel) for q in parts]
        selects.append([add(dsa.Select(r, q), waits=sel) for q in parts])
    groups = range(0, d.HQ, d.HB)
    combines = {}
    for r in range(rows):
        for g in groups:
            heads = [x for h in range(g, min(g + d.HB, d.HQ)) for x in absorb[h]]
            blocks = [add(dsa.Attn(r, g, b), waits=[*selects[r], *heads]) for b in range(d.NB)]
            combines[r, g] = [add(dsa.Combine(r, g, c0), waits=blocks) for c0 in range(0, d.C, d.CC)]
    wuv = []
    for h in range(d.HQ):
        need = [x for r in range(rows) for x in combines[r, h - h % d.HB]]
        wuv += [
            (h * d.V + n0, h * d.V + n0 + d.BN_UV, add(dsa.Wuv(h, n0), waits=need)) for n0 in range(0, d.V, d.BN_UV)
        ]
    oproj = []
    for ks in range(d.KS_O):
        need = _covering(wuv, ks * d.PK, (ks + 1) * d.PK)
        oproj += [(n0, n0 + d.BN_O, add(OProj(n0, ks), waits=need, late=first)) for n0 in range(0, d.D, d.BN_O)]
    return oproj
