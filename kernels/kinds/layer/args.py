"""The layer kernel's arguments, grouped by concern: each group a namedtuple that Triton takes as one argument
(kernel.py reads its fields by name). A layer has one attention half (KDA or MLA) and one FFN half (the dense MLP or
the MoE): only its halves' groups are passed, and the kernel builds only their code (constexprs MLA, MOE).

The tensors' shapes and layouts are in the halves' modules (ops/kda/layer.py, ops/dsa/layer.py, ops/ffn/layer_mlp.py,
layer_moe.py) and launch.py.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from glm53ctl.kernels.ops.dsa.select import SelectDims

T = Any  # a torch.Tensor (or its stand-in for ahead-of-time builds)


# ---- runtime tensors


class GateWeights(NamedTuple):
    """The mHC gates' weights: the attention gate's (_a) and the FFN gate's (_f)."""

    fn_a: T
    base_a: T
    scale_a: T
    norm_a: T
    fn_f: T
    base_f: T
    scale_f: T
    norm_f: T


class KdaWeights(NamedTuple):
    w_in: T  # the fused in-projection f_a | g_a | b | (q_h | k_h | v_h per head)
    w_fb: T
    w_gb: T
    conv_w: T
    A_log: T
    dt_bias: T
    o_norm: T
    w_o: T


class KdaStates(NamedTuple):
    """A KDA layer's states: read from *_in, written to *_out (double-buffered)."""

    conv_in: T
    S_in: T
    conv_out: T
    S_out: T


class KdaBuffers(NamedTuple):
    y_in: T
    lr: T
    z: T
    kscr: T
    ipp: T


class MlaWeights(NamedTuple):
    w_a: T  # the fused A projection: q_a | kv_a | the indexer's wk | its pool gate | its head weights
    q_norm: T
    kv_norm: T
    k_w: T
    k_b: T
    ape: T
    w_qb: T
    w_ukt: T
    w_uv: T
    w_o: T


class MlaCaches(NamedTuple):
    """The DSA caches (replicated; written at each row's position only) and the rows' positions."""

    latent: T
    index_key: T
    index_gate: T
    pooled: T
    pos: T


class MlaBuffers(NamedTuple):
    y_a: T
    qr: T
    wi: T
    q_mla: T
    qi: T
    q_lat: T
    scores: T
    sel_hist: T
    sel_state: T
    sel_above: T
    idx: T
    part_o: T
    part_m: T
    part_l: T
    o_lat: T
    o_mla: T


class MlpWeights(NamedTuple):
    w_gate: T
    w_up: T
    w_down: T


class MlpBuffers(NamedTuple):
    act: T
    gup: T


class MoeWeights(NamedTuple):
    w_r: T
    r_bias: T
    w_eg: T  # the experts stacked [E + 1, ...], the shared one last
    w_eu: T
    w_ed: T


class MoeBuffers(NamedTuple):
    logits: T
    ids: T
    wts: T
    route_on: T
    slots: T
    n_slots: T
    slot_of: T
    gup_m: T
    act_m: T
    y_m: T


class Handoffs(NamedTuple):
    """What every layer's tasks hand each other: the gates' mix logits, sums of squares and Gram matrices, the
    gates' pre and 1/RMS (pr), arrival words, this rank's and the peers' partials of both all-reduces; and the trace."""

    mixp: T
    ssp: T
    gram: T
    pr: T
    arrive: T
    kpart_a: T
    parts_a: T
    kpart_f: T
    parts_f: T
    trace: T


class Peers(NamedTuple):
    """Real ranks (kernels/runtime/ranks.py): this rank's mailbox (the peers' partials of both all-reduces,
    [2, 2, T, R, D]; one device: the parts_a buffer, unread), the addresses of every rank's mailbox and flag words
    (what the OWN tasks push into), and the two all-reduces' arrival words (the last push of each tags it)."""

    slots: T
    slot_bases: T
    flag_bases: T
    arrive: T
    words: int  # where the peers' words start in every rank's flag words (a stage's pushes tag the whole's place)


class Outputs(NamedTuple):
    x_hat_a: T
    post_a: T
    comb_a: T
    attn: T
    H1: T  # the streams after the attention half
    x_hat_f: T
    post_f: T
    comb_f: T
    ffn_out: T
    H2: T  # the streams out


# the launch's outputs by their saved names (what `check` compares), in Outputs' order
OUTPUT_NAMES = ("attn.x_hat", "attn.post", "attn.comb", "attn.out", "attn.H")
OUTPUT_NAMES += ("ffn.x_hat", "ffn.post", "ffn.comb", "ffn.out", "H")


class Consts(NamedTuple):
    """The model's scalars the tasks read."""

    hc_eps: float
    norm_eps: float
    lower_bound: float  # KDA's gate
    ln_eps: float  # the indexer's key norm
    mla_scale: float


# ---- compile-time (tl.constexpr)


class LayerDims(NamedTuple):
    """One rank's shapes and tiles (table.py `Dims`, launch.py `layer_dims`) that both halves' tasks read, KDA's and
    the FFN's: one constexpr record, read by field in ops/kda/layer.py, ops/ffn/layer_*.py and ops/gemv/layer.py."""

    D: int  # the hidden size
    HC: int  # mHC streams
    ITERS: int  # Sinkhorn iterations of the mixes
    HL: int  # KDA heads on this rank
    K: int  # a KDA head's dimension
    W: int  # the short convolution's kernel width
    RG: int  # the gates' low rank (gate_rank)
    I: int  # noqa: E741 (the SPEC's name) the FFN's intermediate share on this rank (an expert's, for the MoE)
    T: int  # the TP width
    P: int  # what o_proj reads: KDA's z or MLA's heads' values
    NIN: int  # the in-projection's rows: the two gates' low-rank inputs, beta per head, q | k | v
    HDR: int  # the in-projection's rows before q | k | v (2 RG + HL)
    PK: int  # o_proj's K slice (P / KS_O)
    IK: int  # down_proj's K slice (I / KS_F)
    CH: int  # columns per mix / reduce chunk (knob chunk_cols)
    NCH: int  # column chunks of a row (D / CH)
    KS_O: int  # o_proj's K slices (knob ksplit)
    KS_F: int  # the dense down_proj's K slices (knob ksplit; 1 for the MoE)
    KS_GU: int  # gate/up's K slices (knob ksplit_gu)
    KS_IN: int  # the in-projection's K slices (knob ksplit_in)
    BN: int  # in-projection rows per task (knob block_n_in)
    BN_GU: int  # gate/up rows per task (knob block_n_gu)
    BN_O: int  # o_proj and down_proj rows per task (knob block_n_out)
    BK_D: int  # the K tile over D (knob block_k, at most D)
    BK_R: int  # the K tile over the gates' rank
    BK_O: int  # o_proj's K tile (within PK)
    BK_I: int  # down_proj's K tile (within IK)
    BK_GU: int  # gate/up's K tile (within a K slice)
    BK_IN: int  # the in-projection's K tile (within a K slice)
    LIMIT: float  # the SwiGLU's clamp (swiglu_limit)
    M: int  # the rows of a GEMV tile: R padded to 16, or a folded GEMV's R * HC stream rows padded
    NV: int  # a KDA head's parts (knob kda_split)


class MlaDims(NamedTuple):
    """The MLA half's sizes on one rank (layer/table.py `Dims._mla` derives them, launch.py `mla_dims` adds the
    tiles it alone needs): one constexpr record, read by field in ops/dsa/layer.py."""

    HQ: int  # MLA heads on this rank
    NOPE: int  # a head's query/key dimensions without the rotary part (qk_nope_head_dim)
    V: int  # a head's value dimensions (v_head_dim)
    C: int  # the latent's width (kv_lora_rank)
    QL: int  # q_a's width (q_lora_rank)
    QLP: int  # QL up to a power of two (a tl.arange over q_a)
    IH: int  # the indexer's head dimension
    HI: int  # the indexer's heads
    KP: int  # tokens per pool (the indexer's kpool)
    WIDTH: int  # tokens a row selects at most: TOPP * KP + KP - 1
    TOPP: int  # pools a row selects (index_pools)
    LMAX: int  # the caches' slots per row (whole pools)
    NA: int  # the fused A projection's rows: q_a | kv_a | wk | pool gate | head weights
    NQB: int  # q_b | the indexer's wq_b: HQ * NOPE + HI * IH rows
    BP: int  # pools per score task
    TB: int  # tokens per attention task (knob token_block; numeric: the combine's order)
    NB: int  # attention blocks a row's selection makes: WIDTH / TB rounded up
    NBP: int  # NB up to a power of two (the combine's tile)
    HB: int  # heads per attention task: a tl.dot tile of 16 to 64
    CC: int  # latent columns per combine task
    HBI: int  # the indexer's heads up to a power of two, at least 16 (a tl.dot tile)
    BN_AB: int  # latent columns per absorb task
    BN_UV: int  # value rows per W_UV task
    BK_A: int  # the A projection's K tile
    BK_QB: int  # q_b's K tile (dividing QL)
    BK_C: int  # W_UV's K tile over the latent
    BK_NOPE: int  # the absorb's K tile over NOPE
    SEL: SelectDims  # the selection's sizes (ops/dsa/select.py), derived once for the caches' pools


class MoeDims(NamedTuple):
    """The MoE half's sizes on one rank (launch.py `moe_dims`): one constexpr record, read by field in
    ops/ffn/layer_moe.py."""

    E: int  # routed experts
    E_ALL: int  # E up to a power of two (the router's tl.arange)
    TOPK: int  # experts a row takes
    SCALE: float  # the routed experts' scale (routed_scaling_factor)
    NSLOT: int  # expert slots of the rows' distinct picks: rows x TOPK up to a power of two
    BLOCK_E: int  # experts per router tile
    KS_RT: int  # the router's K slices
    BK_RT: int  # the router's K tile
    BN_DN: int  # an expert's down_proj rows per task (knob block_n_down)
    EACH: bool  # a routed gate/up task decides its slot's expert from the router's logits (knob route=each)


class Schedule(NamedTuple):
    """The schedule knobs the kernel's code reads (and the diagnostic trace)."""

    OPROJ_FIRST: bool
    PREFETCH: int
    WEIGHTS_FIRST: bool
    PDL_FIRST: bool  # chained by PDL with weights_first: each task's weights issued before gdc_wait
    FOLD: bool
    MIX_TASK: bool
    TRACE: bool
    # the task types this launch's code holds (runtime/tasks.py `types_mask`; knob stage_code=own: a stage's
    # own); 0: every type, one code for every launch of the layer
    ONLY: int = 0
    # the kind's knobs the code reads as they are (`Knob.code`: `KNOB.<name>`), whole
    KNOB: tuple = ()


def pick(group: type[NamedTuple], tensors: dict) -> NamedTuple:
    """A group's tuple from a dict holding its fields by name (and maybe more)."""
    return group(*(tensors[n] for n in group._fields))
