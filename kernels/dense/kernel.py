"""The `dense` launch: one KDA layer with the dense MLP (layers 0-2), one persistent launch per step.

Tasks, in table order (a rank's shapes; every GEMV is `gemv_tile` over rows padded to 16):

  MIX_A   a column chunk of one row's attention-gate mix logits (fn @ H) and sum of squares
  GATE_A  row r: hc_pre without the comb, the RMSNorm: x̂, post             waits on its row's MIX_A
  COMB_A  row r: the Sinkhorn comb (for hc_post; several µs: kept off the in-projection's path)  the same
  INPROJ  (tile, K slice) of the fused in-projection f_a | g_a | b | (q_h | k_h | v_h per head) (knob
          ksplit_in); slice 0 adds the slices' sums (late)                    waits on GATE_A
          (`norm fold`: streams H's stream rows and waits late on GATE_A)
  KDA     (head h, row r, part p): f_b and g_b for the head, conv with its state, safe gate, the delta rule
          on the part's value columns (knob kda_split, `kda_parts`: 1, 2 or 4 parts); the head's last part
          to arrive makes z, the gated RMSNorm                 waits on the INPROJ tiles it reads
  OPROJ   a tile of o_proj over a K slice (ks): this rank's partial
                                                                waits on every part of the slice's heads
  RED_A   a column chunk of one row: the partials summed in rank order (attn), hc_post (H1), and (no MIX_F)
          the FFN gate's mix logits over the chunk  waits on its row's COMB_A, its OPROJ tiles and the peers
  MIX_F   (knob `ffn_mix`, `mix_tasks`) the FFN gate's mix logits over a chunk, as its own task: RED_A then
          leaves them out, so gate/up's stream starts sooner                  waits on its chunk's RED_A
  GATE_F  row r: the FFN gate on H1 (x̂, post)                waits on its row's RED_A (or MIX_F)
  COMB_F  row r: its comb                                                the same
  GU      (tile, K slice) of gate and up (knob ksplit_gu); slice 0 adds the slices' sums (late) and makes
          the clamped SwiGLU: act                                             waits on every GATE_F
          (`norm fold`: streams H1's stream rows, waits on every RED_A, and late on every GATE_F)
  DOWN    a tile of down_proj over a K slice: this rank's partial         waits on the slice's GU tiles
  RED_F   a column chunk of one row: the partials summed in rank order (ffn.out), hc_post (H)
          waits on its row's COMB_F, its DOWN tiles and the peers

The in-projection rows are laid out per head (q_h | k_h | v_h) after the small f_a | g_a | b rows, so a
KDA task waits only on the tiles of its own head. OWN_A / OWN_F replace RED_A / RED_F in a peer's partial
launch (mode "attn" / "ffn"): they write this rank's partial (its K slices summed in order) for the others;
with no hc_post after them, such a launch has no COMB_A ("attn") or COMB_F (both).

Knob `oproj_first`: a KDA task publishes (its head's z, if it arrived last) and leaves its step (decay, k,
delta: 3 vectors) in scratch; its program runs its next task (an o_proj tile, as the table orders them), then
recomputes the new recurrent state from S_in with the same operations (the same bits) and writes both states back.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ffn.kernel import swiglu_act
from glm53ctl.kernels.gemv import fold_norm, folds, gemv_tile, gemv_tile_pair, sum_streams
from glm53ctl.kernels.kda.kernel import SCRATCH, kda_head, kda_norm, kda_write_state
from glm53ctl.kernels.mhc.kernel import gate_comb, gate_pre
from glm53ctl.kernels.runtime.device import (
    arrive_last,
    finish,
    launch_epoch,
    next_task,
    prefetch_l2,
    publish,
    runtime_buffers,
    stamp,
    task_row,
    wait_task,
)
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS
from glm53ctl.kernels.runtime.table import FLAG, TaskTable
from glm53ctl.kernels.tlx import interpreting, to_bf16

MIX_A, GATE_A, INPROJ, KDA, OPROJ, RED_A, GATE_F, GU, DOWN, RED_F, OWN_A, OWN_F, COMB_A, COMB_F, MIX_F = range(15)
TYPE_NAMES = {
    MIX_A: "attn mix",
    GATE_A: "attn gate",
    INPROJ: "in_proj",
    KDA: "kda head",
    OPROJ: "o_proj",
    RED_A: "attn reduce",
    GATE_F: "ffn gate",
    GU: "gate_up",
    DOWN: "down_proj",
    RED_F: "ffn reduce",
    OWN_A: "attn partial",
    OWN_F: "ffn partial",
    COMB_A: "attn comb",
    COMB_F: "ffn comb",
    MIX_F: "ffn mix",
}
MODES = ("full", "attn", "ffn")
PR = tl.constexpr(8)  # floats per row of the gates' pre [HC] and 1/RMS (buffer "pr")


@triton.jit
def _mix_row(H, fn, r, o_c, D: tl.constexpr, HC: tl.constexpr):
    """Row r's gate mix logits [32] and sum of squares over columns o_c: stream by stream in order, the sums
    of fn[:, j, o_c] * H[r, j, o_c]. Every stream's loads go out before the first sum, whose cross-warp step
    is a barrier that later loads would wait behind: one round trip to L2, not HC."""
    NMIX: tl.constexpr = (2 + HC) * HC
    o_m = tl.arange(0, 32)
    b_hs = ()
    b_fns = ()
    for j in tl.static_range(HC):
        b_hs = b_hs + (tl.load(H + (r * HC + j) * D + o_c).to(tl.float32),)
        p_fn = fn + o_m[:, None] * (HC * D) + j * D + o_c[None, :]
        b_fns = b_fns + (tl.load(p_fn, mask=o_m[:, None] < NMIX, other=0.0),)
    mix = tl.zeros((32,), dtype=tl.float32)
    ss = 0.0
    for j in tl.static_range(HC):
        mix = mix + tl.sum(b_fns[j] * b_hs[j][None, :], axis=1)
        ss = ss + tl.sum(b_hs[j] * b_hs[j], axis=0)
    return mix, ss


@triton.jit(noinline=True)
def _gate(
    mixp,
    ssp,
    H,
    base,
    scale,
    norm_w,
    x_hat,
    post,
    comb,
    pr,
    r,
    comb_task,
    hc_eps,
    norm_eps,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    NCH: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Row r's gate from its chunks' mix logits and sums of squares, summed in chunk order. GATE (comb false):
    x̂, post, and pr[r]: pre [HC] and 1/RMS, what a GEMV with the norm folded into its weights scales its
    stream rows by. COMB (comb_task true): the Sinkhorn comb alone, off the path to the GEMV after the gate."""
    o_m = tl.arange(0, 32)
    mix = tl.zeros((32,), dtype=tl.float32)
    ss = 0.0
    for c in tl.static_range(NCH):
        mix += tl.load(mixp + (c * 16 + r) * 32 + o_m)
        ss += tl.load(ssp + c * 16 + r)
    # fn @ (H / rms(H)) = (fn @ H) / rms(H): the unweighted RMSNorm over all streams, applied once
    mix = mix * (1.0 / tl.sqrt(ss / (HC * D) + norm_eps))
    if comb_task:
        gate_comb(mix, base, scale, comb, r, hc_eps, HC, ITERS)
    else:
        p_h = H + r * (HC * D)
        b_pre, rstd = gate_pre(mix, p_h, base, scale, norm_w, x_hat, post, r, hc_eps, norm_eps, D, HC, INTERPRET)
        tl.store(pr + r * PR + tl.arange(0, HC), b_pre)
        tl.store(pr + r * PR + HC, rstd)


@triton.jit
def _prefetch_rows(w, n0, stride, k0, N: tl.constexpr, BLOCK_N: tl.constexpr, K: tl.constexpr):
    """Ask L2 for rows n0.. (BLOCK_N, clamped to N) of a bf16 matrix, columns k0..k0+K: one address per line."""
    o_n = tl.minimum(n0 + tl.arange(0, BLOCK_N), N - 1)
    LINES: tl.constexpr = max(K // 64, 1)
    for c in tl.static_range(0, LINES, 16):  # 16 lines a row at a time (K need not be a power of 2)
        o_l = k0 + tl.minimum(c + tl.arange(0, 16), LINES - 1) * 64
        prefetch_l2(w + o_n[:, None].to(tl.int64) * stride + o_l[None, :])


@triton.jit
def _prefetch(
    ttype,
    a0,
    a1,
    a2,
    w_fb,
    w_gb,
    fn_f,
    w_in,
    w_gate,
    w_up,
    w_o,
    w_down,
    S_in,
    D: tl.constexpr,
    HL: tl.constexpr,
    K: tl.constexpr,
    RG: tl.constexpr,
    I: tl.constexpr,
    P: tl.constexpr,
    PK: tl.constexpr,
    IK: tl.constexpr,
    BN: tl.constexpr,
    BN_GU: tl.constexpr,
    BN_O: tl.constexpr,
    HC: tl.constexpr,
    CH: tl.constexpr,
    NV: tl.constexpr,
    KS_IN: tl.constexpr,
    KS_GU: tl.constexpr,
    WHICH: tl.constexpr,
    MIX_TASK: tl.constexpr,
):
    """Before a task waits, start what it reads that no producer writes: a GEMV task's weight tile, a KDA
    task's recurrent state. Launch-wide, the small latency-bound steps (gates, KDA, reduces) then overlap
    the next stage's weight streaming. WHICH 1: every such task; 2: o_proj, gate/up and down only (what
    fits the L2 while the in-projection streams); 3: only the KDA heads' weights and state and the attention
    reduces' FFN mix rows, or the FFN mix tasks' with MIX_TASK (their latency-bound steps wait long; the GEMV
    stages stream their own)."""
    NIN: tl.constexpr = 2 * RG + HL + 3 * P
    if WHICH == 3:
        if ttype == 3:
            _prefetch_rows(w_fb, a0 * K, RG, 0, P, K, RG)
            _prefetch_rows(w_gb, a0 * K, RG, 0, P, K, RG)
            o_k = tl.arange(0, K)
            o_l = a2 * (K // NV) + tl.arange(0, max(K // NV // 32, 1)) * 32
            prefetch_l2(S_in + (a1 * HL + a0) * (K * K) + o_k[:, None] * K + o_l[None, :])
        elif (ttype == 14) | ((ttype == 5) & (not MIX_TASK)):
            NMIX: tl.constexpr = (2 + HC) * HC
            o_m = tl.minimum(tl.arange(0, 32), NMIX - 1)
            o_l = tl.arange(0, HC * CH // 32)  # 32 fp32 a line: stream j's columns of chunk a0
            o_c = (o_l // (CH // 32)) * D + a0 * CH + (o_l % (CH // 32)) * 32
            prefetch_l2(fn_f + o_m[:, None] * (HC * D) + o_c[None, :])
    elif (ttype == 2) & (WHICH == 1):  # a K slice's columns only
        _prefetch_rows(w_in, a0, D, a1 * (D // KS_IN), NIN, BN, D // KS_IN)
    elif (ttype == 3) & (WHICH == 1):
        o_k = tl.arange(0, K)
        o_l = tl.arange(0, K // 32) * 32
        prefetch_l2(S_in + (a1 * HL + a0) * (K * K) + o_k[:, None] * K + o_l[None, :])
    elif ttype == 4:
        _prefetch_rows(w_o, a0, P, a1 * PK, D, BN_O, PK)
    elif ttype == 7:
        _prefetch_rows(w_gate, a0, D, a1 * (D // KS_GU), I, BN_GU, D // KS_GU)
        _prefetch_rows(w_up, a0, D, a1 * (D // KS_GU), I, BN_GU, D // KS_GU)
    elif ttype == 8:
        _prefetch_rows(w_down, a0, I, a1 * IK, D, BN_O, IK)


@triton.jit
def _own_partial(kpart, r, o_c, R, D: tl.constexpr, KS: tl.constexpr):
    """This rank's partial of row r over columns o_c: its K slices summed in slice order."""
    acc = tl.load(kpart + r * D + o_c)
    for ks in tl.static_range(1, KS):
        acc += tl.load(kpart + (ks * R + r) * D + o_c)
    return acc


@triton.jit
def _reduced(kpart, parts, r, o_c, R, RANK, D: tl.constexpr, KS: tl.constexpr, T: tl.constexpr):
    """Row r's all-reduce over columns o_c: the ranks' partials summed in rank order (this rank's own from
    its K slices, the peers' from `parts` [T, R, D]): the same bits on every rank."""
    own = _own_partial(kpart, r, o_c, R, D, KS)
    acc = tl.where(RANK == 0, own, tl.load(parts + r * D + o_c, mask=RANK != 0, other=0.0))
    for q in tl.static_range(1, T):
        acc += tl.where(RANK == q, own, tl.load(parts + (q * R + r) * D + o_c, mask=RANK != q, other=0.0))
    return acc


@triton.jit
def _hc_post_chunk(a, H, post, comb, H_out, r, o_c, D: tl.constexpr, HC: tl.constexpr, INTERPRET: tl.constexpr):
    """hc_post over columns o_c of row r (hc_post_row's operations, chunked); returns nothing."""
    for j in tl.static_range(HC):
        acc = tl.load(post + r * HC + j) * a
        for i in tl.static_range(HC):
            acc += tl.load(comb + r * (HC * HC) + i * HC + j) * tl.load(H + (r * HC + i) * D + o_c).to(tl.float32)
        tl.store(H_out + (r * HC + j) * D + o_c, to_bf16(acc, INTERPRET))


# ---- task bodies: one function each, not inlined, so the persistent loop carries none of their registers
# (inlined, the compiler hoists their address vectors out of the loop: 255 registers and spills)


@triton.jit(noinline=True)
def _task_mix(H, fn, mixp, ssp, c, r, D: tl.constexpr, HC: tl.constexpr, CH: tl.constexpr):
    """MIX_A (and MIX_F on H1): chunk c of row r's gate mix logits and sum of squares."""
    o_c = c * CH + tl.arange(0, CH)
    mix, ss = _mix_row(H, fn, r, o_c, D, HC)
    tl.store(mixp + (c * 16 + r) * 32 + tl.arange(0, 32), mix)
    tl.store(ssp + c * 16 + r, ss)


@triton.jit
def _fold_rows(acc, pr, R, HC: tl.constexpr, M: tl.constexpr, BN: tl.constexpr):
    """A folded GEMV's sums over H's stream rows [M, BN] to its rows' sums [M / HC, BN]:
    y[r] = 1/RMS[r] * sum_j pre[r, j] * acc[r * HC + j], with the gate's pre and 1/RMS from `pr`."""
    o_s = tl.arange(0, M)
    b_pre = tl.load(pr + (o_s // HC) * PR + o_s % HC, mask=o_s < R * HC, other=0.0)
    y = sum_streams(acc * b_pre[:, None], M, HC, BN)
    o_m = tl.arange(0, M // HC)
    return y * tl.load(pr + o_m * PR + HC, mask=o_m < R, other=0.0)[:, None]


@triton.jit(noinline=True)
def _task_inproj(
    rt,
    row,
    task,
    epoch,
    stuck_site,
    budget_ns,
    trace,
    x,
    w_in,
    pr,
    ipp,
    y_in,
    lr,
    n0,
    ks,
    R,
    D: tl.constexpr,
    HC: tl.constexpr,
    NIN: tl.constexpr,
    RG: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    M: tl.constexpr,
    KS: tl.constexpr,
    FOLD: tl.constexpr,
    TRACE: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    """INPROJ: rows n0.. of the fused in-projection over K slice ks of KS (knob ksplit_in), y_in fp32 and the
    low-rank f_a | g_a rows also in bf16 (lr). A slice but the first stores its sums in `ipp` [KS, 32, NIN] and
    is done; slice 0 waits (late) for them and adds them in slice order.

    x: x̂ [R, D], or (FOLD: knob `norm` "fold", or "auto" at rows <= 4; `gemv.folds`) H's R * HC stream rows
    against w_in ⊙ norm_w, needing nothing from the gate: slice 0 then also waits (late) for the gates and makes
    y[r] = 1/RMS[r] * sum_j pre[r, j] * acc[r * HC + j] (x = sum_j pre_j H_j is linear in H). True unless a
    wait failed."""
    XR = R
    if FOLD:
        XR = R * HC
    KK: tl.constexpr = D // KS
    acc = gemv_tile(x + ks * KK, D, w_in + ks * KK, n0, XR, NIN, KK, D, BN, BK, INTERPRET, M)
    o_s = tl.arange(0, M)
    o_n = n0 + tl.arange(0, BN)
    p_ipp = ipp + o_s[:, None] * NIN + o_n[None, :]
    m_ipp = (o_s[:, None] < XR) & (o_n[None, :] < NIN)
    ok = task >= 0
    if ks != 0:
        tl.store(p_ipp + ks * (32 * NIN), acc, mask=m_ipp)
    else:
        if (KS > 1) or FOLD:
            if TRACE:
                stamp(trace, task, 4, INTERPRET)
            ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, True)
        if ok:
            for q in tl.static_range(1, KS):
                acc += tl.load(p_ipp + q * (32 * NIN), mask=m_ipp, other=0.0)
            if FOLD:
                y = _fold_rows(acc, pr, R, HC, M, BN)
                o_m = tl.arange(0, M // HC)
            else:
                y = acc
                o_m = tl.arange(0, M)
            m_r = o_m[:, None] < R
            tl.store(y_in + o_m[:, None] * NIN + o_n[None, :], y, mask=m_r & (o_n[None, :] < NIN))
            m_lr = m_r & (o_n[None, :] < 2 * RG)
            tl.store(lr + o_m[:, None] * (2 * RG) + o_n[None, :], to_bf16(y, INTERPRET), mask=m_lr)
    return ok


@triton.jit(noinline=True)
def _task_kda(
    epoch,
    y_in,
    lr,
    w_fb,
    w_gb,
    conv_in,
    conv_out,
    conv_w,
    A_log,
    dt_bias,
    o_norm,
    S_in,
    S_out,
    z,
    kscr,
    arrive,
    h,
    r,
    part,
    R,
    lower_bound,
    eps,
    HL: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    RG: tl.constexpr,
    BK_R: tl.constexpr,
    NV: tl.constexpr,
    INTERPRET: tl.constexpr,
    WRITE_STATE: tl.constexpr,
):
    """KDA: part `part` (of NV, knob kda_split) of head h of row r: f_b and g_b for the head (each a [16, K]
    GEMV over the low-rank rows), the delta rule on the part's value columns (their o to `kscr`). The head's
    last part to arrive (`arrive_last`) makes its z from every part's o: the gated RMSNorm. No part waits for
    another: the last one finds the others' o already there."""
    P: tl.constexpr = HL * K
    NIN: tl.constexpr = 2 * RG + HL + 3 * P
    sel = tl.arange(0, 16)[:, None] == r
    f_h = gemv_tile(lr, 2 * RG, w_fb, h * K, R, P, RG, RG, K, BK_R, INTERPRET)
    og_h = gemv_tile(lr + RG, 2 * RG, w_gb, h * K, R, P, RG, RG, K, BK_R, INTERPRET)
    kda_head(
        y_in + 2 * RG + HL,
        NIN,
        K,
        3 * K,
        tl.load(y_in + r * NIN + 2 * RG + h),
        tl.sum(tl.where(sel, f_h, 0.0), axis=0),
        conv_in,
        conv_out,
        conv_w,
        A_log,
        dt_bias,
        S_in,
        S_out,
        kscr,
        r,
        h,
        part,
        lower_bound,
        HL,
        K,
        W,
        NV,
        INTERPRET,
        WRITE_STATE,
    )
    if NV > 1:
        tl.debug_barrier()  # every thread's o stored before the release
        last = arrive_last(arrive + r * HL + h, epoch, NV)
    else:
        last = True
    if last:
        kda_norm(kscr, tl.sum(tl.where(sel, og_h, 0.0), axis=0), o_norm, z, r, h, eps, HL, K, INTERPRET)


@triton.jit(noinline=True)
def _task_partial(
    x,
    w,
    out,
    n0,
    R,
    N: tl.constexpr,
    K: tl.constexpr,
    STRIDE: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """OPROJ / DOWN: output rows n0.. over one K slice (x, w already offset to it): out [R, N]."""
    acc = gemv_tile(x, STRIDE, w, n0, R, N, K, STRIDE, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    tl.store(out + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


@triton.jit(noinline=True)
def _task_reduce(
    kpart,
    parts,
    out,
    H,
    post,
    comb,
    H_out,
    fn,
    mixp,
    ssp,
    c,
    r,
    R,
    RANK,
    D: tl.constexpr,
    HC: tl.constexpr,
    CH: tl.constexpr,
    KS: tl.constexpr,
    T: tl.constexpr,
    MIX: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """RED_A / RED_F: chunk c of row r: the all-reduce (out), hc_post (H_out); RED_A with MIX (no MIX_F tasks)
    also the FFN gate's mix logits over the chunk, from the stored (bf16) H_out values, as MIX_F makes them."""
    o_c = c * CH + tl.arange(0, CH)
    a = _reduced(kpart, parts, r, o_c, R, RANK, D, KS, T)
    tl.store(out + r * D + o_c, a)
    _hc_post_chunk(a, H, post, comb, H_out, r, o_c, D, HC, INTERPRET)
    if MIX:
        mix, ss = _mix_row(H_out, fn, r, o_c, D, HC)
        tl.store(mixp + (c * 16 + r) * 32 + tl.arange(0, 32), mix)
        tl.store(ssp + c * 16 + r, ss)


@triton.jit(noinline=True)
def _task_gate_up(
    rt,
    row,
    task,
    epoch,
    stuck_site,
    budget_ns,
    trace,
    x,
    w_gate,
    w_up,
    pr,
    gup,
    act,
    n0,
    ks,
    R,
    D: tl.constexpr,
    HC: tl.constexpr,
    I: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    LIMIT: tl.constexpr,
    M: tl.constexpr,
    KS: tl.constexpr,
    FOLD: tl.constexpr,
    TRACE: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    """GU: gate and up rows n0.. over K slice ks of KS (knob ksplit_gu), both in one K loop. A slice but the
    first stores its sums in `gup` [KS, 2, 32, I] and is done; slice 0 then waits (late) for them, adds them
    in slice order, and makes the clamped SwiGLU: act, bf16, for down_proj.

    x: x̂ [R, D], or (FOLD, as for the in-projection) H1's R * HC stream rows against w_gate and w_up ⊙ norm_w:
    slice 0 then also waits (late) for the FFN gates and applies their pre and 1/RMS, as the folded
    in-projection does. True unless a wait failed."""
    XR = R
    if FOLD:
        XR = R * HC
    KK: tl.constexpr = D // KS
    g_s, u_s = gemv_tile_pair(x + ks * KK, D, w_gate + ks * KK, w_up + ks * KK, n0, XR, I, KK, D, BN, BK, INTERPRET, M)
    o_s = tl.arange(0, M)
    o_n = n0 + tl.arange(0, BN)
    p_gup = gup + o_s[:, None] * I + o_n[None, :]
    m_gup = (o_s[:, None] < XR) & (o_n[None, :] < I)
    ok = task >= 0
    if ks != 0:
        tl.store(p_gup + (ks * 2) * (32 * I), g_s, mask=m_gup)
        tl.store(p_gup + (ks * 2 + 1) * (32 * I), u_s, mask=m_gup)
    else:
        if (KS > 1) or FOLD:
            if TRACE:
                stamp(trace, task, 4, INTERPRET)
            ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, True)
        if ok:
            for q in tl.static_range(1, KS):
                g_s += tl.load(p_gup + (q * 2) * (32 * I), mask=m_gup, other=0.0)
                u_s += tl.load(p_gup + (q * 2 + 1) * (32 * I), mask=m_gup, other=0.0)
            if FOLD:
                g = _fold_rows(g_s, pr, R, HC, M, BN)
                u = _fold_rows(u_s, pr, R, HC, M, BN)
                o_m = tl.arange(0, M // HC)
            else:
                g = g_s
                u = u_s
                o_m = tl.arange(0, M)
            tl.store(
                act + o_m[:, None] * I + o_n[None, :],
                to_bf16(swiglu_act(g, u, LIMIT), INTERPRET),
                mask=(o_m[:, None] < R) & (o_n[None, :] < I),
            )
    return ok


@triton.jit(noinline=True)
def _task_own(kpart, parts, c, r, R, RANK, D: tl.constexpr, CH: tl.constexpr, KS: tl.constexpr):
    """OWN_A / OWN_F: this rank's partial of chunk c of row r, for the other ranks' reduces."""
    o_c = c * CH + tl.arange(0, CH)
    tl.store(parts + (RANK * R + r) * D + o_c, _own_partial(kpart, r, o_c, R, D, KS))


# the table's sizes do not change the code: no recompile per count that happens to be 1 or a multiple of 16
@triton.jit(do_not_specialize=["stuck_site", "budget_ns", "RANK", "n_tasks", "n_peers", "n_programs"])
def dense_kernel(
    ctl,
    flags,
    boxes,
    errs,
    tasks,
    wait_kind,
    wait_index,
    wait_count,
    pub_slot,
    # inputs and weights
    H,
    fn_a,
    base_a,
    scale_a,
    norm_a,
    fn_f,
    base_f,
    scale_f,
    norm_f,
    w_in,
    w_fb,
    w_gb,
    conv_w,
    A_log,
    dt_bias,
    o_norm,
    w_o,
    w_gate,
    w_up,
    w_down,
    conv_in,
    S_in,
    # writes
    conv_out,
    S_out,
    # hand-off buffers
    mixp,
    ssp,
    y_in,
    lr,
    z,
    kscr,
    arrive,
    kpart_a,
    parts_a,
    act,
    kpart_f,
    parts_f,
    pr,
    ipp,
    gup,
    trace,
    # outputs
    x_hat_a,
    post_a,
    comb_a,
    attn,
    H1,
    x_hat_f,
    post_f,
    comb_f,
    ffn_out,
    H2,
    R,
    RANK,
    hc_eps,
    norm_eps,
    lower_bound,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    D: tl.constexpr,
    HC: tl.constexpr,
    ITERS: tl.constexpr,
    HL: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    RG: tl.constexpr,
    I: tl.constexpr,
    T: tl.constexpr,
    CH: tl.constexpr,
    NCH: tl.constexpr,
    KS_O: tl.constexpr,
    KS_F: tl.constexpr,
    KS_GU: tl.constexpr,
    KS_IN: tl.constexpr,
    BN: tl.constexpr,
    BN_GU: tl.constexpr,
    BN_O: tl.constexpr,
    BK_D: tl.constexpr,
    BK_R: tl.constexpr,
    BK_O: tl.constexpr,
    BK_I: tl.constexpr,
    BK_GU: tl.constexpr,
    BK_IN: tl.constexpr,
    LIMIT: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
    OPROJ_FIRST: tl.constexpr,
    PREFETCH: tl.constexpr,
    FOLD: tl.constexpr,
    M: tl.constexpr,
    TRACE: tl.constexpr,
    NV: tl.constexpr,
    MIX_TASK: tl.constexpr,
):
    P: tl.constexpr = HL * K
    NIN: tl.constexpr = 2 * RG + HL + 3 * P
    HDR: tl.constexpr = 2 * RG + HL  # where the per-head q|k|v rows start in the in-projection
    PK: tl.constexpr = P // KS_O
    IK: tl.constexpr = I // KS_F
    rt = runtime_buffers(ctl, flags, boxes, errs, tasks, wait_kind, wait_index, wait_count, pub_slot)
    epoch = launch_epoch(ctl, INTERPRET)
    n_done = 0
    # oproj_first: the KDA head whose states this program still has to write back
    pend = 0
    pend_r = 0
    pend_h = 0
    pend_p = 0
    task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET)
    while task >= 0:
        row = task_row(rt, task)
        ttype, a0, a1 = row[0], row[1], row[2]
        if TRACE:
            stamp(trace, task, 0, INTERPRET)
        if PREFETCH and not INTERPRET:  # the interpreter has no inline asm; a prefetch changes no bits
            _prefetch(
                ttype,
                a0,
                a1,
                row[3],
                w_fb,
                w_gb,
                fn_f,
                w_in,
                w_gate,
                w_up,
                w_o,
                w_down,
                S_in,
                D,
                HL,
                K,
                RG,
                I,
                P,
                PK,
                IK,
                BN,
                BN_GU,
                BN_O,
                HC,
                CH,
                NV,
                KS_IN,
                KS_GU,
                PREFETCH,
                MIX_TASK,
            )
        # a task's early sites; its late ones (a folded INPROJ's gates, a KDA head's other parts) in its body
        ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, False)
        if TRACE:
            stamp(trace, task, 1, INTERPRET)
        if ok:
            if ttype == 0:
                _task_mix(H, fn_a, mixp, ssp, a0, a1, D, HC, CH)
            elif (ttype == 1) | (ttype == 12):
                _gate(
                    mixp,
                    ssp,
                    H,
                    base_a,
                    scale_a,
                    norm_a,
                    x_hat_a,
                    post_a,
                    comb_a,
                    pr,
                    a0,
                    ttype == 12,
                    hc_eps,
                    norm_eps,
                    D,
                    HC,
                    ITERS,
                    NCH,
                    INTERPRET,
                )
            elif ttype == 2:
                ok = _task_inproj(
                    rt,
                    row,
                    task,
                    epoch,
                    stuck_site,
                    budget_ns,
                    trace,
                    H if FOLD else x_hat_a,
                    w_in,
                    pr,
                    ipp,
                    y_in,
                    lr,
                    a0,
                    a1,
                    R,
                    D,
                    HC,
                    NIN,
                    RG,
                    BN,
                    BK_IN,
                    M,
                    KS_IN,
                    FOLD,
                    TRACE,
                    INTERPRET,
                    POLL,
                    THREADS,
                )
            elif ttype == 3:
                _task_kda(
                    epoch,
                    y_in,
                    lr,
                    w_fb,
                    w_gb,
                    conv_in,
                    conv_out,
                    conv_w,
                    A_log,
                    dt_bias,
                    o_norm,
                    S_in,
                    S_out,
                    z,
                    kscr,
                    arrive,
                    a0,
                    a1,
                    row[3],
                    R,
                    lower_bound,
                    norm_eps,
                    HL,
                    K,
                    W,
                    RG,
                    BK_R,
                    NV,
                    INTERPRET,
                    not OPROJ_FIRST,
                )
            elif ttype == 4:
                _task_partial(z + a1 * PK, w_o + a1 * PK, kpart_a + a1 * R * D, a0, R, D, PK, P, BN_O, BK_O, INTERPRET)
            elif ttype == 8:
                _task_partial(
                    act + a1 * IK, w_down + a1 * IK, kpart_f + a1 * R * D, a0, R, D, IK, I, BN_O, BK_I, INTERPRET
                )
            elif ttype == 5:
                _task_reduce(
                    kpart_a,
                    parts_a,
                    attn,
                    H,
                    post_a,
                    comb_a,
                    H1,
                    fn_f,
                    mixp + NCH * 16 * 32,
                    ssp + NCH * 16,
                    a0,
                    a1,
                    R,
                    RANK,
                    D,
                    HC,
                    CH,
                    KS_O,
                    T,
                    not MIX_TASK,
                    INTERPRET,
                )
            elif ttype == 14:
                _task_mix(H1, fn_f, mixp + NCH * 16 * 32, ssp + NCH * 16, a0, a1, D, HC, CH)
            elif (ttype == 6) | (ttype == 13):
                _gate(
                    mixp + NCH * 16 * 32,
                    ssp + NCH * 16,
                    H1,
                    base_f,
                    scale_f,
                    norm_f,
                    x_hat_f,
                    post_f,
                    comb_f,
                    pr + 16 * PR,
                    a0,
                    ttype == 13,
                    hc_eps,
                    norm_eps,
                    D,
                    HC,
                    ITERS,
                    NCH,
                    INTERPRET,
                )
            elif ttype == 7:
                ok = _task_gate_up(
                    rt,
                    row,
                    task,
                    epoch,
                    stuck_site,
                    budget_ns,
                    trace,
                    H1 if FOLD else x_hat_f,
                    w_gate,
                    w_up,
                    pr + 16 * PR,
                    gup,
                    act,
                    a0,
                    a1,
                    R,
                    D,
                    HC,
                    I,
                    BN_GU,
                    BK_GU,
                    LIMIT,
                    M,
                    KS_GU,
                    FOLD,
                    TRACE,
                    INTERPRET,
                    POLL,
                    THREADS,
                )
            elif ttype == 9:
                _task_reduce(
                    kpart_f,
                    parts_f,
                    ffn_out,
                    H1,
                    post_f,
                    comb_f,
                    H2,
                    fn_f,
                    mixp,
                    ssp,
                    a0,
                    a1,
                    R,
                    RANK,
                    D,
                    HC,
                    CH,
                    KS_F,
                    T,
                    False,
                    INTERPRET,
                )
            elif ttype == 10:
                _task_own(kpart_a, parts_a, a0, a1, R, RANK, D, CH, KS_O)
            elif ttype == 11:
                _task_own(kpart_f, parts_f, a0, a1, R, RANK, D, CH, KS_F)
            if ok:
                publish(rt, row, task, epoch, INTERPRET)
                if TRACE:
                    stamp(trace, task, 2, INTERPRET)
        if OPROJ_FIRST:
            # a KDA head of an earlier task: its states now, after the task that followed it (o is out, that
            # task's loads issued); then this task's head, if it is one, waits for the next task
            if pend != 0:
                kda_write_state(
                    kscr,
                    y_in + HDR,
                    NIN,
                    K,
                    3 * K,
                    conv_in,
                    conv_out,
                    S_in,
                    S_out,
                    pend_r,
                    pend_h,
                    pend_p,
                    HL,
                    K,
                    W,
                    NV,
                    INTERPRET,
                )
                pend = 0
            if (ttype == 3) & ok:
                pend = 1
                pend_h = a0
                pend_r = a1
                pend_p = row[3]
        n_done += 1
        task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok)
    if OPROJ_FIRST:
        if pend != 0:
            kda_write_state(
                kscr,
                y_in + HDR,
                NIN,
                K,
                3 * K,
                conv_in,
                conv_out,
                S_in,
                S_out,
                pend_r,
                pend_h,
                pend_p,
                HL,
                K,
                W,
                NV,
                INTERPRET,
            )
    finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)


def _covering(tiles: list[tuple[int, int, int]], lo: int, hi: int) -> list[int]:
    """The tasks of tiles (lo, hi, task) that overlap [lo, hi)."""
    return [t for a, b, t in tiles if a < hi and lo < b]


def kda_parts(knob: int, heads: int, rows: int, grid: int) -> int:
    """A KDA head's parts: the knob's value, or (0) the most of 4, 2, 1 whose parts, heads x rows x parts, the
    grid's programs cover. Parts pay off only while programs would otherwise sit idle: each re-reads its head's
    f_b, g_b and conv rows (H200, when part 0 still waited for the others and made z: 285 µs at TP1 rows 8
    with 1 part, 325 with 4; 75 at TP8 rows 1 with 4, 81 with 1; the rule picked the fastest of 1, 2, 4 at all
    10 keys measured, docs/perf/2026-11-30-dense.md)."""
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
    """One rank's shapes of a dense layer, and the tile and slice sizes a key's knobs give them."""

    def __init__(self, spec, tp: int, knobs: dict) -> None:
        sh = spec.shards(tp)
        self.D, self.HC, self.iters = spec.hidden, spec.mhc.streams, spec.mhc.sinkhorn_iters
        self.HL, self.K, self.W, self.RG = sh.kda_heads, spec.kda.head_dim, spec.kda.conv_kernel, spec.kda.gate_rank
        self.P, self.I, self.T = self.HL * self.K, sh.dense_inter, tp
        self.NIN = 2 * self.RG + self.HL + 3 * self.P
        self.HDR = 2 * self.RG + self.HL
        # the reduce / mix column chunk (numeric: it sets the order of the gates' sums)
        self.CH = min(knobs["chunk_cols"], self.D // 4)
        self.NCH = self.D // self.CH
        self.KS_O, self.KS_F = k_slices(knobs["ksplit"], self.P), k_slices(knobs["ksplit"], self.I)
        self.KS_GU = k_slices(knobs["ksplit_gu"], self.D)
        self.KS_IN = k_slices(knobs["ksplit_in"], self.D)
        self.PK, self.IK = self.P // self.KS_O, self.I // self.KS_F
        self.BN, self.BN_GU, self.BN_O = knobs["block_n_in"], knobs["block_n_gu"], knobs["block_n_out"]
        bk = knobs["block_k"]
        self.BK_D, self.BK_R, self.BK_O, self.BK_I = (min(bk, n) for n in (self.D, self.RG, self.PK, self.IK))
        self.BK_GU = min(bk, self.D // self.KS_GU)
        self.BK_IN = min(bk, self.D // self.KS_IN)
        # the GEMV body has no K mask: a K slice must be whole K tiles
        for k, tile in ((self.D // self.KS_GU, self.BK_GU), (self.D // self.KS_IN, self.BK_IN), (self.PK, self.BK_O)):
            assert k % tile == 0, f"a K slice of {k} columns is not whole K tiles of {tile}"
        assert self.IK % self.BK_I == 0 and self.D % self.BK_D == 0 and self.RG % self.BK_R == 0


def mix_tasks(knobs: dict, rows: int, streams: int) -> bool:
    """Knob `ffn_mix`: whether the FFN gate's mix logits are tasks of their own. "auto": where gate/up folds
    the norm, so waits for the reduces' H1 alone and starts sooner; unfolded it waits for the FFN gates, which
    would then wait one hand-off more (H200, docs/perf/2026-11-30-dense.md: TP8 rows 1 65.0 -> 62.3 µs,
    rows 8 83.7 -> 85.2)."""
    mode = knobs["ffn_mix"]
    return mode == "task" or (mode == "auto" and folds(knobs["norm"], rows, streams))


def build_table(d: Dims, rows: int, knobs: dict, mode: str = "full") -> TaskTable:
    """The tasks of one rank's launch in topological order. mode "attn": up to this rank's attention partial;
    "ffn": up to its FFN partial (given every rank's attention partial); "full": the whole layer."""
    assert mode in MODES
    t = TaskTable("dense", TYPE_NAMES, peers=0 if mode == "attn" else d.T - 1)
    how, words = knobs["handoff"], knobs["box_words"]

    def add(ttype: int, *args: int, waits: list[int] = (), peers: bool = False, late: bool = False) -> int:
        task = t.add(ttype, *args)
        if waits:
            t.wait(task, sorted(set(waits)), how, words, late)
        if peers and d.T > 1:
            t.wait_peers(task)
        return task

    mix = [[add(MIX_A, c, r) for c in range(d.NCH)] for r in range(rows)]
    gates = [add(GATE_A, r, waits=mix[r]) for r in range(rows)]
    # the Sinkhorn comb: for hc_post in the attention reduces (none in a peer's "attn" launch), not the GEMVs
    combs = [add(COMB_A, r, waits=mix[r]) for r in range(rows)] if mode != "attn" else []
    # a folded INPROJ streams H from the start and waits for its gates at its end
    fold = folds(knobs["norm"], rows, d.HC)
    inproj = []
    for n0 in range(0, d.NIN, d.BN):
        # K slices 1.. first (folded: nothing to wait for); slice 0 adds their sums (late) and stores the rows
        others = [add(INPROJ, n0, ks, waits=[] if fold else gates) for ks in range(d.KS_IN - 1, 0, -1)]
        inproj.append((n0, n0 + d.BN, add(INPROJ, n0, 0, waits=[] if fold else gates)))
        if others:
            t.wait(inproj[-1][2], others, how, words, late=True)
        if fold:
            t.wait(inproj[-1][2], gates, how, words, late=True)
    small = _covering(inproj, 0, 2 * d.RG)  # f_a | g_a: every head's low-rank rows
    nv = kda_parts(knobs["kda_split"], d.HL, rows, knobs["grid"])
    heads = []
    for h in range(d.HL):
        own = small + _covering(inproj, 2 * d.RG + h, 2 * d.RG + h + 1)
        own += _covering(inproj, d.HDR + 3 * d.K * h, d.HDR + 3 * d.K * (h + 1))
        heads.append([add(KDA, h, r, p, waits=own) for r in range(rows) for p in range(nv)])
    oproj = []
    for ks in range(d.KS_O):
        lo, hi = ks * d.PK, (ks + 1) * d.PK
        need = [task for h in range(d.HL) if h * d.K < hi and lo < (h + 1) * d.K for task in heads[h]]
        oproj += [(n0, n0 + d.BN_O, add(OPROJ, n0, ks, waits=need)) for n0 in range(0, d.D, d.BN_O)]
    chunks = [(c, r) for r in range(rows) for c in range(d.NCH)]  # row by row: row 0's gate goes first
    if mode == "attn":
        for c, r in chunks:
            add(OWN_A, c, r, waits=_covering(oproj, c * d.CH, (c + 1) * d.CH))
        return t
    reds = [
        add(RED_A, c, r, waits=[combs[r], *_covering(oproj, c * d.CH, (c + 1) * d.CH)], peers=True) for c, r in chunks
    ]
    mixes = reds  # the tasks that make the FFN gate's mix logits
    if mix_tasks(knobs, rows, d.HC):
        mixes = [add(MIX_F, c, r, waits=[red]) for (c, r), red in zip(chunks, reds, strict=True)]
    gates_f = [add(GATE_F, r, waits=mixes[r * d.NCH : (r + 1) * d.NCH]) for r in range(rows)]
    combs_f = [add(COMB_F, r, waits=mixes[r * d.NCH : (r + 1) * d.NCH]) for r in range(rows)] if mode == "full" else []
    # folded, gate/up streams H1 (written by the reduces) and waits for the FFN gates at its end
    gu = []
    for n0 in range(0, d.I, d.BN_GU):
        # K slices 1.. first; slice 0 adds their sums (late) and makes act
        need = reds if fold else gates_f
        others = [add(GU, n0, ks, waits=need) for ks in range(d.KS_GU - 1, 0, -1)]
        gu.append((n0, n0 + d.BN_GU, add(GU, n0, 0, waits=need)))
        if others:
            t.wait(gu[-1][2], others, how, words, late=True)
        if fold:
            t.wait(gu[-1][2], gates_f, how, words, late=True)
    down = []
    for ks in range(d.KS_F):
        need = _covering(gu, ks * d.IK, (ks + 1) * d.IK)
        down += [(n0, n0 + d.BN_O, add(DOWN, n0, ks, waits=need)) for n0 in range(0, d.D, d.BN_O)]
    for c, r in chunks:
        if mode == "ffn":
            add(OWN_F, c, r, waits=_covering(down, c * d.CH, (c + 1) * d.CH))
        else:
            add(RED_F, c, r, waits=[combs_f[r], *_covering(down, c * d.CH, (c + 1) * d.CH)], peers=True)
    return t


def stage_table(full: TaskTable, ttypes: tuple[int, ...]) -> TaskTable:
    """One stage of the layer as its own launch: the tasks of its types, waiting only on each other (a gate/up
    tile's slice 0 on its other slices); the launch before it has finished. `SeparateLaunches` runs the
    stages one after another: the baseline to beat."""
    t = TaskTable("dense", TYPE_NAMES)
    new = {}
    for i, task in enumerate(full.tasks):
        if task[0] in ttypes:
            new[i] = t.add(*task)
            for s in full.sites[full.first_site[i] : full.first_site[i + 1] if i + 1 < full.n_tasks else None]:
                inside = [new[p] for p in s.producers if p in new]
                assert len(inside) in (0, len(s.producers)), "a site waits on one stage"
                if inside:
                    t.wait(new[i], inside, "flag" if s.kind == FLAG else "box", late=s.late)
    return t


class SeparateLaunches:
    """The same task bodies as one launch per stage (10 launches, the same buffers and the same bits); a gate
    and its comb, independent of each other, are one stage, and so are the attention reduces and the FFN mix
    tasks after them (where `mix_tasks`: the baseline keeps its 10 launches)."""

    STAGES = ((MIX_A,), (GATE_A, COMB_A), (INPROJ,), (KDA,), (OPROJ,), (RED_A, MIX_F), (GATE_F, COMB_F), (GU,))
    STAGES += ((DOWN,), (RED_F,))

    def __init__(self, spec, tp: int, rows: int, knobs: dict, device) -> None:
        self.whole = DenseLaunch(spec, tp, rows, knobs, device)
        self.stages = [DenseLaunch(spec, tp, rows, knobs, device, stage=s, share=self.whole) for s in self.STAGES]

    def __call__(self, H, w, conv_in, S_in, check=True) -> dict[str, torch.Tensor]:
        for s in self.stages:
            s(H, w, conv_in, S_in, check=check)
        return self.whole.out


def prepare_weights(w, spec, tp: int, device, fold: bool = False) -> dict[str, torch.Tensor]:
    """One rank's layer weights as the kernel reads them (done once per key, like a checkpoint's fused
    layout): the in-projection rows f_a | g_a | b | (q_h | k_h | v_h per head), the conv taps [3P, W] fp32.
    fold (`gemv.folds` of knob `norm` and the rows): the in-projection, gate and up times their gate's norm
    weight, rounded to bf16 once."""
    a_ = "self_attn."
    from glm53ctl.tuning.knobs import defaults

    norm_f = w["post_attention_layernorm.weight"]
    d = Dims(spec, tp, defaults("dense"))  # the layout depends on no knob
    qkv = torch.stack([w[f"{a_}{n}_proj.weight"].view(d.HL, d.K, d.D) for n in ("q", "k", "v")], dim=1)
    w_in = torch.cat([w[f"{a_}{n}.weight"] for n in ("f_a_proj", "g_a_proj", "b_proj")] + [qkv.reshape(-1, d.D)])
    out = {
        "fn_a": w["hc_attn_fn"].float(),
        "base_a": w["hc_attn_base"].float(),
        "scale_a": w["hc_attn_scale"].float(),
        "norm_a": w["input_layernorm.weight"],
        "fn_f": w["hc_ffn_fn"].float(),
        "base_f": w["hc_ffn_base"].float(),
        "scale_f": w["hc_ffn_scale"].float(),
        "norm_f": w["post_attention_layernorm.weight"],
        "w_in": fold_norm(w["input_layernorm.weight"], w_in) if fold else w_in.to(torch.bfloat16),
        "w_fb": w[f"{a_}f_b_proj.weight"],
        "w_gb": w[f"{a_}g_b_proj.weight"],
        "conv_w": torch.cat([w[f"{a_}{n}_conv1d.weight"][:, 0] for n in ("q", "k", "v")]).float(),
        "A_log": w[f"{a_}A_log"].float(),
        "dt_bias": w[f"{a_}dt_bias"].float(),
        "o_norm": w[f"{a_}o_norm.weight"],
        "w_o": w[f"{a_}o_proj.weight"],
        "w_gate": fold_norm(norm_f, w["mlp.gate_proj.weight"]) if fold else w["mlp.gate_proj.weight"],
        "w_up": fold_norm(norm_f, w["mlp.up_proj.weight"]) if fold else w["mlp.up_proj.weight"],
        "w_down": w["mlp.down_proj.weight"],
    }
    return {k: v.to(device).contiguous() for k, v in out.items()}


OUTPUTS = (
    "attn.x_hat",
    "attn.post",
    "attn.comb",
    "attn.out",
    "attn.H",
    "ffn.x_hat",
    "ffn.post",
    "ffn.comb",
    "ffn.out",
    "H",
)


class DenseLaunch:
    """One build key of `dense` for one rank: table and buffers laid out once; each call is one launch.

    mode "full" (rank 0 of a TP launch, or TP1): every output; the peers' partials are read from
    `parts_a` / `parts_f` [T, R, D] (set_peers). Modes "attn" and "ffn" are the peers' partial launches."""

    def __init__(
        self,
        spec,
        tp: int,
        rows: int,
        knobs: dict,
        device,
        rank: int = 0,
        mode: str = "full",
        stage: tuple[int, ...] | None = None,
        share: DenseLaunch | None = None,
    ) -> None:
        from glm53ctl.kernels.runtime import Runtime

        self.spec, self.tp, self.rows, self.knobs, self.rank, self.mode = spec, tp, rows, knobs, rank, mode
        self.device = torch.device(device)
        self.d = d = Dims(spec, tp, knobs)
        self.table = build_table(d, rows, knobs, mode)
        self.grid = knobs["grid"]
        if stage is not None:
            self.table = stage_table(self.table, stage)
            self.grid = min(self.grid, self.table.n_tasks)
        self.tracing = False  # a diagnostic build: each task's claim, ready and publish times (runtime/trace.py)
        # the KDA heads' arrival words (`arrive_last`): tagged with the epoch of the launch's own runtime, so
        # never shared with another launch (a stage of separate launches has its own)
        self.arrive = torch.zeros(rows * d.HL, dtype=torch.int32, device=self.device)
        if share is not None:  # a stage of separate launches works in the buffers of the whole launch
            self.runtime = Runtime(self.table, self.device, max_programs=self.grid)
            self.buf, self.out, self.conv_out, self.S_out = share.buf, share.out, share.conv_out, share.S_out
            return
        self.runtime = Runtime(self.table, self.device, max_programs=self.grid)
        f32, bf16 = torch.float32, torch.bfloat16
        e = lambda *shape, dtype=f32: torch.zeros(shape, dtype=dtype, device=self.device)
        R, D, HC = rows, d.D, d.HC
        self.buf = {
            "mixp": e(2, d.NCH, 16, 32),
            "ssp": e(2, d.NCH, 16),
            "y_in": e(R, d.NIN),
            "lr": e(R, 2 * d.RG, dtype=bf16),
            "z": e(R, d.P, dtype=bf16),
            "kscr": e(R, SCRATCH, d.P),
            "kpart_a": e(d.KS_O, R, D),
            "parts_a": e(tp, R, D),
            "act": e(R, d.I, dtype=bf16),
            "kpart_f": e(d.KS_F, R, D),
            "parts_f": e(tp, R, D),
            "pr": e(2, 16, PR.value),  # the attention and FFN gates' pre and 1/RMS per row
            "gup": e(d.KS_GU, 2, 32, d.I),  # gate/up's K-slice sums (slice 0 adds them)
            "ipp": e(d.KS_IN, 32, d.NIN),  # the in-projection's K-slice sums
            "trace": e(self.table.n_tasks, 5, dtype=torch.int64),  # written only by a traced launch
        }
        self.out = {
            "attn.x_hat": e(R, D, dtype=bf16),
            "attn.post": e(R, HC),
            "attn.comb": e(R, HC, HC),
            "attn.out": e(R, D),
            "attn.H": e(R, HC, D, dtype=bf16),
            "ffn.x_hat": e(R, D, dtype=bf16),
            "ffn.post": e(R, HC),
            "ffn.comb": e(R, HC, HC),
            "ffn.out": e(R, D),
            "H": e(R, HC, D, dtype=bf16),
        }
        st = spec.shards(tp).state_shapes(rows, 1)
        self.conv_out = e(*st["kda.conv"], dtype=bf16)
        self.S_out = e(*st["kda.recurrent"])

    def set_peers(self, parts_a: torch.Tensor | None = None, parts_f: torch.Tensor | None = None) -> None:
        """The other ranks' partials [T, R, D] (this rank's slot is ignored): what the all-reduces read."""
        if parts_a is not None:
            self.buf["parts_a"].copy_(parts_a)
        if parts_f is not None:
            self.buf["parts_f"].copy_(parts_f)

    def poison(self) -> None:
        """NaN in every output and write, so an element the launch leaves alone fails every check; and in every
        hand-off buffer a task fills for another (not the peers' partials, set before), so a task that reads
        one before its producer wrote it, or a launch that leaves one as an earlier launch wrote it (a fault's
        retry with the same inputs, say), reads NaN instead of values that happen to be right."""
        for t in [*self.out.values(), self.conv_out, self.S_out]:
            t.fill_(float("nan"))
        for name, t in self.buf.items():
            if t.is_floating_point() and name not in ("parts_a", "parts_f"):
                t.fill_(float("nan"))

    def kernel_args(self, H, w, conv_in, S_in, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS) -> dict:
        o = self.out
        return (
            self.runtime.args()
            | {"H": H, **w, "conv_in": conv_in, "S_in": S_in, "conv_out": self.conv_out, "S_out": self.S_out}
            | self.buf
            | {
                "arrive": self.arrive,
                "x_hat_a": o["attn.x_hat"],
                "post_a": o["attn.post"],
                "comb_a": o["attn.comb"],
                "attn": o["attn.out"],
                "H1": o["attn.H"],
                "x_hat_f": o["ffn.x_hat"],
                "post_f": o["ffn.post"],
                "comb_f": o["ffn.comb"],
                "ffn_out": o["ffn.out"],
                "H2": o["H"],
                "R": self.rows,
                "RANK": self.rank,
                "hc_eps": self.spec.mhc.eps,
                "norm_eps": self.spec.model.rms_norm_eps,
                "lower_bound": self.spec.kda.gate_lower_bound,
                "n_tasks": self.table.n_tasks,
                "n_peers": self.table.peers,
                "n_programs": self.grid,
                "stuck_site": stuck_site,
                "budget_ns": budget_ns,
            }
        )

    def constexprs(self) -> dict:
        d = self.d
        names = ("D", "HC", "HL", "K", "W", "RG", "I", "T", "CH", "NCH", "KS_O", "KS_F", "KS_GU", "KS_IN")
        names += ("BN", "BN_GU", "BN_O")
        return {n: getattr(d, n) for n in names} | {
            "ITERS": d.iters,
            "BK_D": d.BK_D,
            "BK_R": d.BK_R,
            "BK_O": d.BK_O,
            "BK_I": d.BK_I,
            "BK_GU": d.BK_GU,
            "BK_IN": d.BK_IN,
            "LIMIT": self.spec.moe.swiglu_limit,
            "INTERPRET": interpreting(),
            "POLL": self.knobs["poll"],
            "THREADS": 32 * self.knobs["warps"],
            "OPROJ_FIRST": bool(self.knobs["oproj_first"]),
            "PREFETCH": self.knobs["prefetch"],
            "FOLD": folds(self.knobs["norm"], self.rows, d.HC),
            # a folded GEMV's rows are H's R * HC stream rows, padded to a `tl.dot` tile
            "M": 16 if not folds(self.knobs["norm"], self.rows, d.HC) or self.rows * d.HC <= 16 else 32,
            "TRACE": self.tracing,
            "NV": kda_parts(self.knobs["kda_split"], d.HL, self.rows, self.knobs["grid"]),
            "MIX_TASK": mix_tasks(self.knobs, self.rows, d.HC),
        }

    def options(self) -> dict:
        opts = {"num_warps": self.knobs["warps"], "num_stages": self.knobs["stages"]}
        if self.knobs["maxnreg"]:  # a cap for ptxas: fewer registers, more programs resident per SM
            opts["maxnreg"] = self.knobs["maxnreg"]
        return opts

    def __call__(self, H, w, conv_in, S_in, stuck_site=-1, budget_ns=None, check=True) -> dict[str, torch.Tensor]:
        R, d = self.rows, self.d
        assert H.shape == (R, d.HC, d.D) and H.dtype == torch.bfloat16 and H.is_contiguous()
        assert conv_in.shape == self.conv_out.shape and conv_in.dtype == torch.bfloat16 and conv_in.is_contiguous()
        assert S_in.shape == self.S_out.shape and S_in.dtype == torch.float32 and S_in.is_contiguous()
        # double-buffered: a KDA head's part 0 shifts the conv state while its other parts may still read it
        assert conv_in.data_ptr() != self.conv_out.data_ptr() and S_in.data_ptr() != self.S_out.data_ptr()
        args = self.kernel_args(H, w, conv_in, S_in, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        dense_kernel[(self.grid,)](**args, **self.constexprs(), **self.options())
        if check:
            self.runtime.check()
        return self.out

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        bf16, f32 = (torch.empty(1, dtype=t) for t in (torch.bfloat16, torch.float32))
        w = {k: (bf16 if k.startswith("w_") or k in ("norm_a", "norm_f", "o_norm") else f32) for k in WEIGHTS}
        return self.kernel_args(bf16, w, bf16, f32)


WEIGHTS = (
    "fn_a",
    "base_a",
    "scale_a",
    "norm_a",
    "fn_f",
    "base_f",
    "scale_f",
    "norm_f",
    "w_in",
    "w_fb",
    "w_gb",
    "conv_w",
    "A_log",
    "dt_bias",
    "o_norm",
    "w_o",
    "w_gate",
    "w_up",
    "w_down",
)
