"""Knob `prefetch` (and the first tile of a separate-pdl stage): before a task waits, ask L2 for what it reads that
no producer writes. A prefetch changes no bits, only when bytes arrive; the interpreter has no inline asm, so
runs none."""

import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.tasks import DOWN, GU
from glm53ctl.kernels.ops.gemv.tasks import OPROJ
from glm53ctl.kernels.ops.kda.tasks import INPROJ, KDA_HEAD
from glm53ctl.kernels.ops.mhc.tasks import MIX_F, RED_A
from glm53ctl.kernels.runtime.device import prefetch_l2, row_type
from glm53ctl.kernels.runtime.tasks import fields, may_run


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
    row,
    gates,
    attn_w,
    attn_state,
    ffn_w,
    dims: tl.constexpr,
    MLA: tl.constexpr,
    MOE: tl.constexpr,
    WHICH: tl.constexpr,
    MIX_TASK: tl.constexpr,
    ONLY: tl.constexpr = 0,
):
    """Before a task waits, start what it reads that no producer writes: a GEMV task's weight tile, a KDA
    task's recurrent state. Launch-wide, the small latency-bound steps (gates, KDA, reduces) then overlap
    the next stage's weight streaming. WHICH 1 (a separate-pdl stage's first task): every such task; 3 (knob
    `prefetch`): only the KDA heads' weights and state and the attention reduces' FFN mix rows, or the FFN mix
    tasks' with MIX_TASK (their latency-bound steps wait long; the GEMV stages stream their own). Only the
    halves the layer has: KDA's tasks (MLA false), the dense MLP's (MOE false). row: the task's `task_row`."""
    ttype = row_type(row)
    D: tl.constexpr = dims.D
    K: tl.constexpr = dims.K
    if WHICH == 3:
        if not MLA:
            if may_run(ONLY, KDA_HEAD) and (ttype == KDA_HEAD):
                h, r, part = fields(row, KDA_HEAD)
                _prefetch_rows(attn_w.w_fb, h * K, dims.RG, 0, dims.P, K, dims.RG)
                _prefetch_rows(attn_w.w_gb, h * K, dims.RG, 0, dims.P, K, dims.RG)
                o_k = tl.arange(0, K)
                o_l = part * (K // dims.NV) + tl.arange(0, max(K // dims.NV // 32, 1)) * 32
                prefetch_l2(attn_state.S_in + (r * dims.HL + h) * (K * K) + o_k[:, None] * K + o_l[None, :])
        if may_run(ONLY, MIX_F, RED_A) and ((ttype == MIX_F) | ((ttype == RED_A) & (not MIX_TASK))):
            HC: tl.constexpr = dims.HC
            CH: tl.constexpr = dims.CH
            NMIX: tl.constexpr = (2 + HC) * HC
            o_m = tl.minimum(tl.arange(0, 32), NMIX - 1)
            c, _ = fields(row, MIX_F)
            o_l = tl.arange(0, HC * CH // 32)  # 32 fp32 a line: stream j's columns of chunk c
            o_c = (o_l // (CH // 32)) * D + c * CH + (o_l % (CH // 32)) * 32
            prefetch_l2(gates.fn_f + o_m[:, None] * (HC * D) + o_c[None, :])
    else:
        if not MLA:
            if may_run(ONLY, INPROJ) and (ttype == INPROJ):  # a K slice's columns only
                n0, ks = fields(row, INPROJ)
                KK: tl.constexpr = D // dims.KS_IN
                _prefetch_rows(attn_w.w_in, n0, D, ks * KK, dims.NIN, dims.BN, KK)
            elif may_run(ONLY, KDA_HEAD) and (ttype == KDA_HEAD):
                h, r, _ = fields(row, KDA_HEAD)
                o_k = tl.arange(0, K)
                o_l = tl.arange(0, K // 32) * 32
                prefetch_l2(attn_state.S_in + (r * dims.HL + h) * (K * K) + o_k[:, None] * K + o_l[None, :])
        if may_run(ONLY, OPROJ) and (ttype == OPROJ):
            n0, ks = fields(row, OPROJ)
            _prefetch_rows(attn_w.w_o, n0, dims.P, ks * dims.PK, D, dims.BN_O, dims.PK)
        if not MOE:
            if may_run(ONLY, GU) and (ttype == GU):
                n0, ks = fields(row, GU)
                KG: tl.constexpr = D // dims.KS_GU
                _prefetch_rows(ffn_w.w_gate, n0, D, ks * KG, dims.I, dims.BN_GU, KG)
                _prefetch_rows(ffn_w.w_up, n0, D, ks * KG, dims.I, dims.BN_GU, KG)
            elif may_run(ONLY, DOWN) and (ttype == DOWN):
                n0, ks = fields(row, DOWN)
                _prefetch_rows(ffn_w.w_down, n0, dims.I, ks * dims.IK, D, dims.BN_O, dims.IK)
