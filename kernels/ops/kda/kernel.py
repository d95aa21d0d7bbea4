"""The KDA core as a Triton task body, one (row, head) each: short conv with its state, safe gate, L2 norms,
the gated delta rule on the fp32 state, and the gated RMSNorm (docs/model.md §4).

The in-projections (u = q|k|v, b, f, og) come from GEMV tasks and o_proj follows; this body sits between
them in the `dense` and `kda` launches (issue 7). `kda_core` runs it as a plain launch, one program per
(row, head): the interpreter tests check it against `naive.py`, and it is the separate-launch baseline.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.tlx import interpreting, pinned, to_bf16

# the symbols of the noinline task bodies below (tlx.pinned: a move keeps their cubins)
SYMBOLS = "glm53ctl.kernels.ops.kda.kernel"


@triton.jit
def kda_conv_shift(
    u,
    u_row,
    u_part,
    u_head,
    conv_in,
    conv_out,
    r,
    h,
    H: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Head h's conv state after this token (row r): the last W-2 raw inputs moved up, then this token's."""
    P: tl.constexpr = H * K
    o_k = tl.arange(0, K)
    for part in tl.static_range(3):
        chan = part * P + h * K + o_k
        for tau in tl.static_range(1, W - 1):
            b_past = tl.load(conv_in + (r * (W - 1) + tau) * (3 * P) + chan)
            tl.store(conv_out + (r * (W - 1) + tau - 1) * (3 * P) + chan, b_past)
        b_u = tl.load(u + r * u_row + part * u_part + h * u_head + o_k)
        tl.store(conv_out + (r * (W - 1) + W - 2) * (3 * P) + chan, to_bf16(b_u, INTERPRET))


# value columns of the state per step: a [K, VB] fp32 tile stays in registers (fixed per model: it sets no
# sum's order across columns, but a tile's shape may set the order of the sums over keys). VB = min(BV, K / 4):
# a head's columns are at least 4 blocks, so a head splits into 1, 2 or 4 parts of whole blocks (knob kda_split)
BV = tl.constexpr(32)
SCRATCH = tl.constexpr(4)  # fp32 vectors per (row, head) in `scr`: o, and for a deferred write-back delta, decay, k


@pinned(SYMBOLS)
@triton.jit(noinline=True)
def kda_write_state(
    scr,
    u,
    u_row,
    u_part,
    u_head,
    conv_in,
    conv_out,
    S_in,
    S_out,
    r,
    h,
    part,
    H: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    NV: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """The deferred write-back of part `part` (of NV) of head h's states (row r): its value columns of the
    recurrent state recomputed from S_in and the step's decay, k and delta (kept in `scr` by kda_head), with
    kda_head's operations (so its bits); part 0 also the shifted conv state."""
    P: tl.constexpr = H * K
    VB: tl.constexpr = min(BV, K // 4)
    o_k = tl.arange(0, K)
    p_scr = scr + (r * SCRATCH) * P + h * K
    decay = tl.load(p_scr + 2 * P + o_k)
    k = tl.load(p_scr + 3 * P + o_k)
    for j0 in tl.static_range(0, K // NV, VB):
        o_j = part * (K // NV) + j0 + tl.arange(0, VB)
        p_s = (r * H + h) * (K * K) + o_k[:, None] * K + o_j[None, :]
        s = tl.load(S_in + p_s) * decay[:, None]
        delta = tl.load(p_scr + P + o_j)
        s = tl.fma(k[:, None], delta[None, :], s)  # an explicit fma: the write-back repeats these bits
        tl.store(S_out + p_s, s)
    if part == 0:
        kda_conv_shift(u, u_row, u_part, u_head, conv_in, conv_out, r, h, H, K, W, INTERPRET)


@triton.jit
def _conv_silu(
    u, u_row, u_part, u_head, conv_in, conv_w, r, h, part, o_c, H: tl.constexpr, K: tl.constexpr, W: tl.constexpr
):
    """Causal depthwise conv + SiLU of channels o_c (within head h's `part` of q|k|v) for row r."""
    P: tl.constexpr = H * K
    chan = part * P + h * K + o_c
    acc = tl.load(conv_w + chan * W + (W - 1)) * tl.load(u + r * u_row + part * u_part + h * u_head + o_c)
    for tau in tl.static_range(W - 1):
        acc += tl.load(conv_w + chan * W + tau) * tl.load(conv_in + (r * (W - 1) + tau) * (3 * P) + chan).to(tl.float32)
    return acc * tl.sigmoid(acc)


@triton.jit
def kda_head(
    u,
    u_row,
    u_part,
    u_head,
    beta_logit,
    b_f,
    conv_in,
    conv_out,
    conv_w,
    A_log,
    dt_bias,
    S_in,
    S_out,
    scr,
    r,
    h,
    part,
    lower_bound,
    H: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    NV: tl.constexpr,
    INTERPRET: tl.constexpr,
    WRITE_STATE: tl.constexpr,
):
    """Row r, local head h, value columns of part `part` of NV: the delta rule on those columns and their
    output o (to `scr`), and their new states (written here if WRITE_STATE, else later by kda_write_state
    from what this leaves in `scr`). kda_norm then turns the head's o into z.

    u: raw q|k|v (fp32), head h's part p at u + r*u_row + p*u_part + h*u_head; beta_logit (b) and b_f (f) this
    head's values; conv_in/out [R, W-1, 3P] bf16 (oldest tap first, q|k|v channels); conv_w [3P, W] (tap W-1
    on the current input); S_in/out [R, H, K, K] fp32 (S[i = key, j = value]); scr [R, SCRATCH, P] fp32.

    The state is updated VB value columns at a time (columns are independent in the delta rule), so a
    [K, VB] tile is live instead of [K, K]; so are a part's columns, so parts give the same bits as one."""
    P: tl.constexpr = H * K
    VB: tl.constexpr = min(BV, K // 4)
    o_k = tl.arange(0, K)
    p_scr = scr + (r * SCRATCH) * P + h * K
    y_q = _conv_silu(u, u_row, u_part, u_head, conv_in, conv_w, r, h, 0, o_k, H, K, W)
    y_k = _conv_silu(u, u_row, u_part, u_head, conv_in, conv_w, r, h, 1, o_k, H, K, W)
    # safe gate, beta, L2 norms (q scaled after its norm)
    a = tl.exp(tl.load(A_log + h))
    g = lower_bound * tl.sigmoid(a * (b_f + tl.load(dt_bias + h * K + o_k)))
    decay = tl.exp(g)
    beta = tl.sigmoid(beta_logit)
    q = y_q / tl.sqrt(tl.sum(y_q * y_q, axis=0) + 1e-6) * (1.0 / tl.sqrt(K * 1.0))
    k = y_k / tl.sqrt(tl.sum(y_k * y_k, axis=0) + 1e-6)
    # gated delta rule per value block: decay along the key dim, read S^T k, update, output from the
    # UPDATED state
    for j0 in tl.static_range(0, K // NV, VB):
        o_j = part * (K // NV) + j0 + tl.arange(0, VB)
        y_v = _conv_silu(u, u_row, u_part, u_head, conv_in, conv_w, r, h, 2, o_j, H, K, W)
        p_s = (r * H + h) * (K * K) + o_k[:, None] * K + o_j[None, :]
        _delta_block(tl.load(S_in + p_s), decay, k, q, beta, y_v, S_out, p_s, p_scr, o_j, P, WRITE_STATE)
    _head_end(u, u_row, u_part, u_head, conv_in, conv_out, decay, k, p_scr, r, h, part, H, K, W, INTERPRET,
              WRITE_STATE)  # fmt: skip


@triton.jit
def _delta_block(s_in, decay, k, q, beta, y_v, S_out, p_s, p_scr, o_j, P: tl.constexpr, WRITE_STATE: tl.constexpr):
    """One value block of the gated delta rule from its state tile s_in [K, VB]: decay along the key dim, read
    S^T k, update, and the output from the UPDATED state; the new tile stored (or, deferred, its delta)."""
    s = s_in * decay[:, None]
    delta = beta * (y_v - tl.sum(s * k[:, None], axis=0))
    s = tl.fma(k[:, None], delta[None, :], s)  # an explicit fma: the write-back repeats these bits
    if WRITE_STATE:
        tl.store(S_out + p_s, s)
    else:
        tl.store(p_scr + P + o_j, delta)
    tl.store(p_scr + o_j, tl.sum(s * q[:, None], axis=0))


@triton.jit
def _head_end(u, u_row, u_part, u_head, conv_in, conv_out, decay, k, p_scr, r, h, part, H: tl.constexpr,
              K: tl.constexpr, W: tl.constexpr, INTERPRET: tl.constexpr, WRITE_STATE: tl.constexpr):  # fmt: skip
    """A KDA part's last stores: deferred, its decay and k (for the write-back); else part 0 the conv state."""
    P: tl.constexpr = H * K
    o_k = tl.arange(0, K)
    if not WRITE_STATE:
        # every part stores the same decay and k (the same bits): each part's write-back reads its own
        tl.store(p_scr + 2 * P + o_k, decay)
        tl.store(p_scr + 3 * P + o_k, k)
    if WRITE_STATE:
        if part == 0:
            kda_conv_shift(u, u_row, u_part, u_head, conv_in, conv_out, r, h, H, K, W, INTERPRET)


@triton.jit
def kda_norm(scr, b_og, o_norm_w, z, r, h, eps, H: tl.constexpr, K: tl.constexpr, INTERPRET: tl.constexpr):
    """Head h's z (row r): the gated RMSNorm (sigmoid gate b_og [K]) of o, which kda_head's parts left in
    `scr` (this program's threads or, split, other programs: the caller acquired their stores)."""
    P: tl.constexpr = H * K
    o_k = tl.arange(0, K)
    tl.debug_barrier()  # o's blocks were stored by other threads
    o = tl.load(scr + (r * SCRATCH) * P + h * K + o_k, cache_modifier=".cg")  # or programs: from L2, not L1
    zz = o / tl.sqrt(tl.sum(o * o, axis=0) / K + eps) * tl.load(o_norm_w + o_k).to(tl.float32) * tl.sigmoid(b_og)
    tl.store(z + r * P + h * K + o_k, to_bf16(zz, INTERPRET))


@triton.jit
def kda_core_kernel(
    u,
    b,
    f,
    og,
    conv_in,
    conv_out,
    conv_w,
    A_log,
    dt_bias,
    o_norm_w,
    S_in,
    S_out,
    z,
    scr,
    lower_bound,
    eps,
    H: tl.constexpr,
    K: tl.constexpr,
    W: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    r = tl.program_id(0)
    h = tl.program_id(1)
    P: tl.constexpr = H * K
    o_k = tl.arange(0, K)
    kda_head(
        u, 3 * P, P, K, tl.load(b + r * H + h), tl.load(f + r * P + h * K + o_k), conv_in, conv_out, conv_w, A_log,
        dt_bias, S_in, S_out, scr, r, h, 0, lower_bound, H, K, W, 1, INTERPRET, True,
    )  # fmt: skip
    kda_norm(scr, tl.load(og + r * P + h * K + o_k), o_norm_w, z, r, h, eps, H, K, INTERPRET)


def kda_core(u, b, f, og, conv_state, S, conv_w, A_log, dt_bias, o_norm_w, spec):
    """(z [R, P] bf16, new conv state [R, W-1, 3P] bf16, new S [R, H, K, K] fp32); the inputs are not written.

    conv_w is [3P, W] fp32 (the q, k and v conv1d weights [P, 1, W] concatenated and squeezed)."""
    R, H = b.shape
    K, W = spec.kda.head_dim, spec.kda.conv_kernel
    P = H * K
    assert u.shape == (R, 3 * P) and f.shape == og.shape == (R, P) and S.shape == (R, H, K, K)
    assert conv_state.shape == (R, W - 1, 3 * P) and conv_w.shape == (3 * P, W)
    z = torch.empty(R, P, dtype=torch.bfloat16, device=u.device)
    conv_out = torch.empty(R, W - 1, 3 * P, dtype=torch.bfloat16, device=u.device)
    S_out = torch.empty_like(S)
    kda_core_kernel[(R, H)](
        u.float().contiguous(),
        b.float().contiguous(),
        f.float().contiguous(),
        og.float().contiguous(),
        conv_state.to(torch.bfloat16).contiguous(),
        conv_out,
        conv_w.float().contiguous(),
        A_log.float().contiguous(),
        dt_bias.float().contiguous(),
        o_norm_w.contiguous(),
        S.float().contiguous(),
        S_out,
        z,
        torch.empty(R, SCRATCH, H * K, dtype=torch.float32, device=u.device),
        spec.kda.gate_lower_bound,
        spec.model.rms_norm_eps,
        H=H,
        K=K,
        W=W,
        INTERPRET=interpreting(),
    )
    return z, conv_out, S_out
