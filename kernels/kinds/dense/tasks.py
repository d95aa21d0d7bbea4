"""The `dense` kind's task bodies (and the `kda` kind's, which shares the kernel): the ops' bodies (mHC, KDA,
GEMV, SwiGLU, the MoE) applied to a task's slice of the layer, and what only this kind does (prefetch, the
all-reduce over rank partials, K-slice sums, the routing's last arrival). The claim loop in kernel.py dispatches
to them; the tasks themselves are described in table.py.
"""

import triton
import triton.language as tl

from glm53ctl.kernels.kinds.task_types import DOWN, GU, INPROJ, KDA_HEAD, MIX_F, OPROJ, RED_A
from glm53ctl.kernels.ops.ffn.kernel import swiglu_act
from glm53ctl.kernels.ops.ffn.moe import expert_gate_up, make_slots, moe_sum_cols, route_row, slot_expert, store_act
from glm53ctl.kernels.ops.gemv.kernel import gemv_tile, gemv_tile_pair, sum_streams
from glm53ctl.kernels.ops.kda.kernel import kda_head, kda_norm
from glm53ctl.kernels.ops.mhc.kernel import gate_comb, gate_pre, gate_scale, hc_post_cols, mix_row
from glm53ctl.kernels.runtime.device import arrive_last, prefetch_l2, stamp, wait_task
from glm53ctl.kernels.tlx import to_bf16

PR = tl.constexpr(8)  # floats per row of the gates' pre [HC] and 1/RMS (buffer "pr")


@triton.jit(noinline=True)
def task_gate(
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
    mix = gate_scale(mix, ss, norm_eps, D, HC)
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
def prefetch(
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
        if ttype == KDA_HEAD:
            _prefetch_rows(w_fb, a0 * K, RG, 0, P, K, RG)
            _prefetch_rows(w_gb, a0 * K, RG, 0, P, K, RG)
            o_k = tl.arange(0, K)
            o_l = a2 * (K // NV) + tl.arange(0, max(K // NV // 32, 1)) * 32
            prefetch_l2(S_in + (a1 * HL + a0) * (K * K) + o_k[:, None] * K + o_l[None, :])
        elif (ttype == MIX_F) | ((ttype == RED_A) & (not MIX_TASK)):
            NMIX: tl.constexpr = (2 + HC) * HC
            o_m = tl.minimum(tl.arange(0, 32), NMIX - 1)
            o_l = tl.arange(0, HC * CH // 32)  # 32 fp32 a line: stream j's columns of chunk a0
            o_c = (o_l // (CH // 32)) * D + a0 * CH + (o_l % (CH // 32)) * 32
            prefetch_l2(fn_f + o_m[:, None] * (HC * D) + o_c[None, :])
    elif (ttype == INPROJ) & (WHICH == 1):  # a K slice's columns only
        _prefetch_rows(w_in, a0, D, a1 * (D // KS_IN), NIN, BN, D // KS_IN)
    elif (ttype == KDA_HEAD) & (WHICH == 1):
        o_k = tl.arange(0, K)
        o_l = tl.arange(0, K // 32) * 32
        prefetch_l2(S_in + (a1 * HL + a0) * (K * K) + o_k[:, None] * K + o_l[None, :])
    elif ttype == OPROJ:
        _prefetch_rows(w_o, a0, P, a1 * PK, D, BN_O, PK)
    elif ttype == GU:
        _prefetch_rows(w_gate, a0, D, a1 * (D // KS_GU), I, BN_GU, D // KS_GU)
        _prefetch_rows(w_up, a0, D, a1 * (D // KS_GU), I, BN_GU, D // KS_GU)
    elif ttype == DOWN:
        _prefetch_rows(w_down, a0, I, a1 * IK, D, BN_O, IK)


@triton.jit
def _own_partial(kpart, r, o_c, R, D: tl.constexpr, KS: tl.constexpr):
    """This rank's partial of row r over columns o_c: its K slices summed in slice order."""
    acc = tl.load(kpart + r * D + o_c)
    for ks in tl.static_range(1, KS):
        acc += tl.load(kpart + (ks * R + r) * D + o_c)
    return acc


@triton.jit
def _reduced(own, parts, r, o_c, R, RANK, D: tl.constexpr, T: tl.constexpr):
    """Row r's all-reduce over columns o_c: the ranks' partials summed in rank order (this rank's own, the
    peers' from `parts` [T, R, D]): the same bits on every rank."""
    acc = tl.where(RANK == 0, own, tl.load(parts + r * D + o_c, mask=RANK != 0, other=0.0))
    for q in tl.static_range(1, T):
        acc += tl.where(RANK == q, own, tl.load(parts + (q * R + r) * D + o_c, mask=RANK != q, other=0.0))
    return acc


@triton.jit
def _own(
    kpart, moe, r, o_c, R, D: tl.constexpr, KS: tl.constexpr, MOE: tl.constexpr, TOPK: tl.constexpr, NSLOT: tl.constexpr
):
    """This rank's partial of row r over columns o_c: its K slices summed (kpart), or (MOE) the MoE's sum over
    the slots' outputs, moe = (y, ids, weights, slot_of)."""
    if MOE:
        acc = moe_sum_cols(moe[0], moe[1], moe[2], moe[3], r, o_c, D, TOPK, NSLOT)
    else:
        acc = _own_partial(kpart, r, o_c, R, D, KS)
    return acc


# ---- task bodies: one function each, not inlined, so the persistent loop carries none of their registers
# (inlined, the compiler hoists their address vectors out of the loop: 255 registers and spills)


@triton.jit(noinline=True)
def task_mix(H, fn, mixp, ssp, c, r, D: tl.constexpr, HC: tl.constexpr, CH: tl.constexpr):
    """MIX_A (and MIX_F on H1): chunk c of row r's gate mix logits and sum of squares."""
    o_c = c * CH + tl.arange(0, CH)
    mix, ss = mix_row(H, fn, r, o_c, D, HC)
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
def task_inproj(
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
def task_kda(
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
def task_partial(
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
def task_reduce(
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
    moe,
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
    MOE: tl.constexpr,
    TOPK: tl.constexpr,
    NSLOT: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """RED_A / RED_F: chunk c of row r: the all-reduce (out), hc_post (H_out); RED_A with MIX (no MIX_F tasks)
    also the FFN gate's mix logits over the chunk, from the stored (bf16) H_out values, as MIX_F makes them.
    RED_F of the MoE (MOE) sums the slots' outputs for its own partial (`_own`)."""
    o_c = c * CH + tl.arange(0, CH)
    a = _reduced(_own(kpart, moe, r, o_c, R, D, KS, MOE, TOPK, NSLOT), parts, r, o_c, R, RANK, D, T)
    tl.store(out + r * D + o_c, a)
    hc_post_cols(a, H, post, comb, H_out, r, o_c, D, HC, INTERPRET)
    if MIX:
        mix, ss = mix_row(H_out, fn, r, o_c, D, HC)
        tl.store(mixp + (c * 16 + r) * 32 + tl.arange(0, 32), mix)
        tl.store(ssp + c * 16 + r, ss)


@triton.jit(noinline=True)
def task_gate_up(
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
def task_own(
    kpart,
    parts,
    moe,
    c,
    r,
    R,
    RANK,
    D: tl.constexpr,
    CH: tl.constexpr,
    KS: tl.constexpr,
    MOE: tl.constexpr,
    TOPK: tl.constexpr,
    NSLOT: tl.constexpr,
):
    """OWN_A / OWN_F: this rank's partial of chunk c of row r, for the other ranks' reduces."""
    o_c = c * CH + tl.arange(0, CH)
    tl.store(parts + (RANK * R + r) * D + o_c, _own(kpart, moe, r, o_c, R, D, KS, MOE, TOPK, NSLOT))


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


@triton.jit(noinline=True)
def task_expert_gate_up(
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
    over the slice (`expert_gate_up`; nothing for a slot no row chose). A slice but the first stores its sums in
    `gup` [NSLOT + 1, KS, 2, 16, I] and is done; slice 0 then waits (late: every slice 0 does, chosen or not, so
    every site can be stuck) for them, adds them in slice order, and makes the slot's act. True unless a wait
    failed."""
    expert, live = slot_expert(slots, n_slots, j, E, NSLOT)
    g = tl.zeros((16, BN), dtype=tl.float32)
    u = tl.zeros((16, BN), dtype=tl.float32)
    if live:
        g, u = expert_gate_up(x, w_gate, w_up, expert, n0, ks, R, I, D, KS, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    p_gup = gup + (j * KS * 2 * 16 + o_m[:, None]) * I + o_n[None, :]
    m_gup = (o_m[:, None] < R) & (o_n[None, :] < I)
    ok = task >= 0
    if ks != 0:
        if live:
            tl.store(p_gup + (ks * 2) * (16 * I), g, mask=m_gup)
            tl.store(p_gup + (ks * 2 + 1) * (16 * I), u, mask=m_gup)
    else:
        if KS > 1:
            if TRACE:
                stamp(trace, task, 4, INTERPRET)
            ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, True)
        if ok & live:
            for q in tl.static_range(1, KS):
                g += tl.load(p_gup + (q * 2) * (16 * I), mask=m_gup, other=0.0)
                u += tl.load(p_gup + (q * 2 + 1) * (16 * I), mask=m_gup, other=0.0)
            store_act(g, u, act + j * 16 * I, n0, R, I, BN, LIMIT, INTERPRET)
    return ok


# the table's sizes do not change the code: no recompile per count that happens to be 1 or a multiple of 16
