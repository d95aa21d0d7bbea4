"""MLA with the k-pool indexer, the attention half of `sparse`, as tasks of the layer kernel (kernel.py, constexpr
MLA): the DSA bodies of kernels/ops/dsa applied to a task's share (the steps: kernels/ops/dsa/kernel.py; the tasks
and their waits: table.py `_add_mla`), and their dispatch. Not inlined, as every task body: the claim loop carries
none of their registers. o_proj and the all-reduce after it are every layer's (shared.py).

Its arguments (launch.py): weights `MlaWeights`, caches `MlaCaches` (and each row's position), buffers `MlaBuffers`
(a rank's; R rows): y_a [R, NA] fp32 (the A projection), qr [R, QL] bf16, wi [R, HI] fp32 (the
indexer's head weights), q [R, HQ * NOPE] bf16, qi [R, HI * IH] fp32, q_lat [R, HQ, C] bf16, scores [R, LMAX //
KP] fp32, the selection's sel_hist [R, 4, SNQ, 256], sel_state [R, 4, 2] and sel_above [R, 4, SNQ] int32,
idx [R, WIDTH] int32, the attention partials part_o [R, NB, HQ, C] and part_m, part_l [R, NB, HQ] fp32,
o_lat [R, HQ, C] bf16, o [R, HQ * V] bf16 (what o_proj reads). The caches [R, LMAX, ...] are written at each
row's position only.
"""

import triton
import triton.language as tl

from glm53ctl.kernels.ops.dsa.attend import attend_block, combine_blocks
from glm53ctl.kernels.ops.dsa.indexer import scores_block
from glm53ctl.kernels.ops.dsa.kernel import mla_row
from glm53ctl.kernels.ops.dsa.select import select_pass, select_take, select_take_local
from glm53ctl.kernels.ops.dsa.tasks import (
    ABSORB,
    ATTN,
    COMBINE,
    MLA_A,
    MLA_QB,
    MLA_ROW,
    SCORE,
    SEL_PASS,
    SELECT,
    WUV,
)
from glm53ctl.kernels.ops.gemv.kernel import gemv_tile
from glm53ctl.kernels.ops.gemv.layer import task_gemv
from glm53ctl.kernels.runtime.tasks import fields, may_run
from glm53ctl.kernels.tlx import pinned, to_bf16

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.kinds.layer.mla"


@triton.jit
def mla_task(
    ttype, row, H, attn_w, attn_state, attn_buf, outs, consts, R, dims: tl.constexpr, mla: tl.constexpr,
    ONLY: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """The MLA half's task, if it is one (row: its table row) of the types the launch's code holds (ONLY:
    runtime/tasks.py `may_run`)."""
    w, c, b = attn_w, attn_state, attn_buf
    if may_run(ONLY, MLA_A) and (ttype == MLA_A):
        n0 = fields(row, MLA_A)
        task_gemv(
            x=outs.x_hat_a, w=w.w_a, out=b.y_a, n0=n0, R=R, N=mla.NA, K=dims.D, STRIDE=dims.D, BN=dims.BN, BK=mla.BK_A,
            INTERPRET=INTERPRET,
        )  # fmt: skip
    elif may_run(ONLY, MLA_ROW) and (ttype == MLA_ROW):
        r, part = fields(row, MLA_ROW)
        task_mla_row(
            y_a=b.y_a,
            qr=b.qr,
            wi=b.wi,
            caches=(c.latent, c.index_key, c.index_gate, c.pooled),
            norms=(w.q_norm, w.kv_norm, w.k_w, w.k_b, w.ape),
            pos=c.pos,
            r=r,
            part=part,
            eps=consts.norm_eps,
            ln_eps=consts.ln_eps,
            QL=mla.QL,
            QLP=mla.QLP,
            C=mla.C,
            IH=mla.IH,
            HI=mla.HI,
            KP=mla.KP,
            LMAX=mla.LMAX,
            INTERPRET=INTERPRET,
        )
    elif may_run(ONLY, MLA_QB) and (ttype == MLA_QB):
        n0 = fields(row, MLA_QB)
        task_qb(b.qr, w.w_qb, b.q_mla, b.qi, n0, R, mla.QL, mla.HQ * mla.NOPE, mla.NQB, dims.BN, mla.BK_QB, INTERPRET)
    elif may_run(ONLY, ABSORB) and (ttype == ABSORB):
        h, c0 = fields(row, ABSORB)
        task_head_gemv(b.q_mla, w.w_ukt, b.q_lat, h, c0, R, mla.HQ, mla.C, mla.NOPE, mla.BN_AB, mla.BK_NOPE, INTERPRET)
    elif may_run(ONLY, SCORE) and (ttype == SCORE):
        r, block = fields(row, SCORE)
        task_score(
            b.qi,
            b.wi,
            c.pooled,
            b.scores,
            c.pos,
            r,
            block,
            mla.HI,
            mla.IH,
            mla.KP,
            mla.LMAX,
            mla.BP,
            mla.HBI,
            INTERPRET,
        )
    elif may_run(ONLY, SEL_PASS) and (ttype == SEL_PASS):
        r, step, part = fields(row, SEL_PASS)
        sel = (b.sel_hist, b.sel_state, b.sel_above)
        task_select_pass(b.scores, sel, c.pos, r, step, part, mla.KP, mla.TOPP, mla.LMAX, mla.SEL.PART, mla.SEL.NQ,
                         mla.SEL.BLOCK)  # fmt: skip
    elif may_run(ONLY, SELECT) and (ttype == SELECT):
        r, part = fields(row, SELECT)
        sel = (b.sel_hist, b.sel_state, b.sel_above)
        if mla.SEL.PASSES < 4:  # knob select_passes: a body of its own, so the default's keeps its symbol
            task_select_local(b.scores, b.idx, sel, c.pos, r, part, mla.KP, mla.TOPP, mla.WIDTH, mla.LMAX, mla.SEL.PART,
                              mla.SEL.NQ, mla.SEL.BLOCK, mla.SEL.PASSES, mla.SEL.ALL)  # fmt: skip
        else:
            task_select(b.scores, b.idx, sel, c.pos, r, part, mla.KP, mla.TOPP, mla.WIDTH, mla.LMAX, mla.SEL.PART,
                        mla.SEL.NQ, mla.SEL.BLOCK)  # fmt: skip
    elif may_run(ONLY, ATTN) and (ttype == ATTN):
        r, group, block = fields(row, ATTN)
        task_attn(
            b.q_lat, c.latent, b.idx, (b.part_o, b.part_m, b.part_l), r, group, block, consts.mla_scale, mla.HQ, mla.C,
            mla.WIDTH, mla.NB, mla.TB, mla.HB, mla.LMAX, INTERPRET,
        )  # fmt: skip
    elif may_run(ONLY, COMBINE) and (ttype == COMBINE):
        r, group, c0 = fields(row, COMBINE)
        task_combine(
            (b.part_o, b.part_m, b.part_l),
            b.o_lat,
            r,
            group,
            c0,
            mla.HQ,
            mla.C,
            mla.NB,
            mla.NBP,
            mla.HB,
            mla.CC,
            INTERPRET,
        )
    elif may_run(ONLY, WUV) and (ttype == WUV):
        h, n0 = fields(row, WUV)
        task_head_gemv(b.o_lat, w.w_uv, b.o_mla, h, n0, R, mla.HQ, mla.V, mla.C, mla.BN_UV, mla.BK_C, INTERPRET)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_mla_row(
    y_a, qr, wi, caches, norms, pos, r, part, eps, ln_eps, QL: tl.constexpr, QLP: tl.constexpr, C: tl.constexpr,
    IH: tl.constexpr, HI: tl.constexpr, KP: tl.constexpr, LMAX: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    """MLA_ROW (row r, part): part 0 q_a's norm (what q_b reads); part 1 the head weights and the cache writes at
    its position (`mla_row`). caches: (latent, index_key, index_gate, pooled); norms: (q_a's, kv_a's, the key's
    LayerNorm weight and bias, the pool ape)."""
    mla_row(
        y_a, qr, wi, caches[0], caches[1], caches[2], caches[3], norms[0], norms[1], norms[2], norms[3], norms[4],
        r, tl.load(pos + r), eps, ln_eps, QL, QLP, C, IH, HI, KP, LMAX, INTERPRET, part,
    )  # fmt: skip


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_qb(
    qr,
    w_qb,
    q,
    qi,
    n0,
    R,
    QL: tl.constexpr,
    NQ: tl.constexpr,
    NQB: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """MLA_QB (rows n0.. of q_b | wq_b over qr): the heads' q (bf16, what the absorb reads) and the indexer's
    query qi (fp32: its scores decide the selection)."""
    acc = gemv_tile(qr, QL, w_qb, n0, R, NQB, QL, QL, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    m_r = o_m[:, None] < R
    tl.store(q + o_m[:, None] * NQ + o_n[None, :], to_bf16(acc, INTERPRET), mask=m_r & (o_n[None, :] < NQ))
    m_i = m_r & (o_n[None, :] >= NQ) & (o_n[None, :] < NQB)
    tl.store(qi + o_m[:, None] * (NQB - NQ) + (o_n[None, :] - NQ), acc, mask=m_i)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_head_gemv(
    x,
    w,
    out,
    h,
    n0,
    R,
    HQ: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """ABSORB / WUV (head h, rows n0..): out[r, h, n] (bf16, [R, HQ, N]) = Σ_k x[r, h, k] w[h, n, k] for every row:
    x [R, HQ, K] bf16 (q against W_UKᵀ, or o_lat against W_UV), w [HQ, N, K] bf16."""
    acc = gemv_tile(x + h * K, HQ * K, w + h * N * K, n0, R, N, K, K, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    at = out + (o_m[:, None] * HQ + h) * N + o_n[None, :]
    tl.store(at, to_bf16(acc, INTERPRET), mask=(o_m[:, None] < R) & (o_n[None, :] < N))


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_score(
    qi,
    wi,
    pooled,
    scores,
    pos,
    r,
    b,
    HI: tl.constexpr,
    IH: tl.constexpr,
    KP: tl.constexpr,
    LMAX: tl.constexpr,
    BP: tl.constexpr,
    HBI: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """SCORE (row r, pools b·BP..): the row's index scores of its complete pools in the block (none past them)."""
    P = (tl.load(pos + r) + 1) // KP
    NP: tl.constexpr = LMAX // KP
    if b * BP < P:
        scores_block(
            qi + r * HI * IH, wi + r * HI, pooled + r.to(tl.int64) * NP * IH, scores + r * NP, b * BP, P, HI, IH, BP,
            IH**-0.5, INTERPRET, HBI,
        )  # fmt: skip


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_select_pass(
    scores,
    sel,
    pos,
    r,
    i,
    q,
    KP: tl.constexpr,
    TOPP: tl.constexpr,
    LMAX: tl.constexpr,
    PART: tl.constexpr,
    NQ: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """SEL_PASS (row r, pass i, part q): `select_pass`; sel: the selection's buffers (hist, state, above); PART,
    NQ, BLOCK: the selection's sizes (`SelectDims`, mla.SEL), by their names."""
    s, n = scores + r * (LMAX // KP), tl.load(pos + r) + 1
    h, st, ab = sel[0] + r * (4 * NQ * 256), sel[1] + r * 8, sel[2] + r * (4 * NQ)
    if i == 0:
        select_pass(s, h, st, ab, n, q, 0, KP, TOPP, PART, NQ, BLOCK)
    elif i == 1:
        select_pass(s, h, st, ab, n, q, 1, KP, TOPP, PART, NQ, BLOCK)
    elif i == 2:
        select_pass(s, h, st, ab, n, q, 2, KP, TOPP, PART, NQ, BLOCK)
    else:
        select_pass(s, h, st, ab, n, q, 3, KP, TOPP, PART, NQ, BLOCK)


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_select(
    scores,
    idx,
    sel,
    pos,
    r,
    q,
    KP: tl.constexpr,
    TOPP: tl.constexpr,
    WIDTH: tl.constexpr,
    LMAX: tl.constexpr,
    PART: tl.constexpr,
    NQ: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """SELECT (row r, part q): the part's tokens (`select_take`) after its passes."""
    select_take(
        scores + r * (LMAX // KP), idx + r * WIDTH, sel[0] + r * (4 * NQ * 256), sel[1] + r * 8, sel[2] + r * (4 * NQ),
        tl.load(pos + r) + 1, q, KP, TOPP, WIDTH, PART, NQ, BLOCK,
    )  # fmt: skip


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_select_local(scores, idx, sel, pos, r, q, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr,
                      LMAX: tl.constexpr, PART: tl.constexpr, NQ: tl.constexpr, BLOCK: tl.constexpr,
                      PASSES: tl.constexpr, ALL: tl.constexpr):  # fmt: skip
    """SELECT (row r, part q) after PASSES < 4 passes (knob select_passes): `select_take_local`, the threshold's
    other digits found here over every pool's key."""
    select_take_local(scores + r * (LMAX // KP), idx + r * WIDTH, sel[0] + r * (4 * NQ * 256), sel[1] + r * 8,
                      tl.load(pos + r) + 1, q, KP, TOPP, WIDTH, PART, NQ, BLOCK, PASSES, ALL)  # fmt: skip


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_attn(
    q_lat,
    latent,
    idx,
    parts,
    r,
    h0,
    b,
    scale,
    HQ: tl.constexpr,
    C: tl.constexpr,
    WIDTH: tl.constexpr,
    NB: tl.constexpr,
    TB: tl.constexpr,
    HB: tl.constexpr,
    LMAX: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """ATTN (row r, heads h0.., token block b): the block's partial (`attend_block`); parts: (o, m, l)."""
    attend_block(
        q_lat, latent, idx, parts[0], parts[1], parts[2], r, h0, b, HQ, C, WIDTH, NB, TB, HB, LMAX, scale, INTERPRET
    )


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def task_combine(
    parts,
    o_lat,
    r,
    h0,
    c0,
    HQ: tl.constexpr,
    C: tl.constexpr,
    NB: tl.constexpr,
    NBP: tl.constexpr,
    HB: tl.constexpr,
    CC: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """COMBINE (row r, heads h0.., latent columns c0..): the blocks' partials (`combine_blocks`)."""
    combine_blocks(parts[0], parts[1], parts[2], o_lat, r, h0, c0, NB, HQ, C, NB, NBP, HB, CC, INTERPRET)
