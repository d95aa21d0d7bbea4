"""The `tail` launch: mean of the streams, final RMSNorm, vocab-parallel lm_head, logits gathered.

Tasks: NORM (one per row: ĥ[r] and its 1/RMS), GEMV (a slice of this rank's lm_head rows; waits on every
NORM, by flags or by one box line), GATHER (a slice of a peer's logits; waits on that peer's arrival).

Knobs (defaults measured on the H200, docs/perf/2026-11-30-runtime-embed-tail.md):
- `norm` "fold": the final norm's weight is folded into lm_head once on the host (w' = w ⊙ norm_w), so a
  GEMV task streams H's stream rows against w' at once and waits for the NORM tasks' 1/RMS only at its end,
  to scale its sums: the hand-off leaves the critical path (different bits: a `numeric` knob). "task": a
  GEMV task waits for ĥ before its weights stream. "auto" (dense's default, not tail's): fold at rows <= 4.
- `split` "even": the lm_head rows dealt evenly, one task per program; "tiles": block_n rows a task.
- `gathers` "last": GATHER tasks after the GEMV tasks, run beside the stream by the programs kept out of the
  deal; "first": before them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.gemv import fold_norm, folds, gemv_tile, sum_streams
from glm53ctl.kernels.runtime.device import (
    finish,
    launch_epoch,
    next_task,
    prefetch_l2,
    publish,
    runtime_buffers,
    task_row,
    wait_task,
)
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS
from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.tlx import interpreting, to_bf16

NORM, GEMV, GATHER = 0, 1, 2
TYPE_NAMES = {NORM: "norm", GEMV: "lm_head", GATHER: "gather"}
GATHER_N = 1024  # logits columns a GATHER task copies
SPARE_EVERY = 16  # split "even" with gathers "last": one program in SPARE_EVERY is kept out of the GEMV deal


@triton.jit
def _lm_head_folded(
    H,
    w,
    n0,
    R,
    D: tl.constexpr,
    HC: tl.constexpr,
    N,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    M: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """sum_j H[m, j] . w'[n0 + n] for rows m < R: [M // HC, BLOCK_N] fp32. H's R * HC stream rows are the
    GEMV's rows as they are (bf16, contiguous), so nothing is computed between a load and the `tl.dot`."""
    acc = gemv_tile(H, D, w, n0, R * HC, N, D, D, BLOCK_N, BLOCK_K, INTERPRET, M)
    return sum_streams(acc, M, HC, BLOCK_N)


@triton.jit(do_not_specialize=["stuck_site", "budget_ns"])
def tail_kernel(
    ctl,
    flags,
    boxes,
    errs,
    tasks,
    wait_kind,
    wait_index,
    wait_count,
    pub_slot,
    H,
    norm_w,
    h_hat,
    rstd,
    lm_w,
    logits,
    peer_logits,
    R,
    eps,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    D: tl.constexpr,
    HC: tl.constexpr,
    V_LOCAL: tl.constexpr,
    V: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
    PREFETCH: tl.constexpr,
    GATHER_COLS: tl.constexpr,
    NORM_FOLD: tl.constexpr,
    M: tl.constexpr,
):
    rt = runtime_buffers(ctl, flags, boxes, errs, tasks, wait_kind, wait_index, wait_count, pub_slot)
    epoch = launch_epoch(ctl, INTERPRET)
    n_done = 0
    task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET)
    while task >= 0:
        row = task_row(rt, task)
        ttype, a0, a1 = row[0], row[1], row[2]
        nxt = task * 0 - 1
        ahead = 0
        if PREFETCH and not INTERPRET:  # the interpreter has no inline asm; a prefetch changes no bits
            if ttype == 1:
                # start streaming this task's weights into L2 while it waits for the normalized rows
                o_n = tl.minimum(a0 + tl.arange(0, BLOCK_N), V_LOCAL - 1)
                o_l = tl.arange(0, D * 2 // 128) * 64
                prefetch_l2(lm_w + o_n[:, None].to(tl.int64) * D + o_l[None, :])
        # a folded GEMV task waits after its stream (below); every other task before it starts
        ok = task >= 0
        if (ttype != 1) | (NORM_FOLD == 0):
            ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, False)
        if ok:
            if ttype == 0:
                # NORM: ĥ[r] = RMSNorm(mean_j H[r, j]) * w for row a0, in one pass over the row (the
                # streams' loads all in flight at once), stored bf16 (an output, and norm "task"'s GEMV rows),
                # and its 1/RMS (norm "fold"'s GEMV scale)
                o_d = tl.arange(0, D)
                p_h = H + a0 * (HC * D) + o_d
                b_h = tl.zeros((D,), dtype=tl.float32)
                for j in tl.static_range(HC):
                    b_h += tl.load(p_h + j * D).to(tl.float32)
                b_h = b_h / HC
                r_std = 1.0 / tl.sqrt(tl.sum(b_h * b_h, axis=0) / D + eps)
                b_w = tl.load(norm_w + o_d).to(tl.float32)
                tl.store(h_hat + a0 * D + o_d, to_bf16(b_h * r_std * b_w, INTERPRET))
                tl.store(rstd + a0, r_std)
            elif ttype == 1:
                # GEMV: logits[:, a0:a0+a1] (a1 <= BLOCK_N) of this rank's vocab slice (rank 0: columns 0..V_LOCAL)
                o_n = a0 + tl.arange(0, BLOCK_N)
                n_end = a0 + a1
                if NORM_FOLD:
                    o_m = tl.arange(0, M // HC)
                    acc = _lm_head_folded(H, lm_w, a0, R, D, HC, n_end, BLOCK_N, BLOCK_K, M, INTERPRET)
                    # the next claim goes out before the wait, so its round trip overlaps the poll's (a task
                    # claimed here and then dropped on a failed wait is harmless: the launch is aborted)
                    nxt = next_task(ctl, n_tasks, n_done + 1, n_programs, INTERPRET)
                    ahead = 1
                    ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, False)
                    # the mean of the streams, then the rows' 1/RMS (the norm weight is in lm_w)
                    acc = acc / HC * tl.load(rstd + o_m, mask=o_m < R, other=0.0)[:, None]
                else:
                    o_m = tl.arange(0, 16)
                    acc = gemv_tile(h_hat, D, lm_w, a0, R, n_end, D, D, BLOCK_N, BLOCK_K, INTERPRET)
                p_o = logits + o_m[:, None].to(tl.int64) * V + o_n[None, :]
                tl.store(p_o, acc, mask=(o_m[:, None] < R) & (o_n[None, :] < n_end) & ok)
            else:
                # GATHER: peer a0's logits columns a1.. into their place in the full rows, every row at once
                # (a loop over rows is R dependent round trips: at 8 rows the copies outlasted the stream), in
                # 256-column pieces (a whole [8, 1024] tile's addresses take 250 registers)
                o_r = tl.arange(0, 8)
                for c0 in range(a1, a1 + GATHER_COLS, 256):
                    o_c = c0 + tl.arange(0, 256)
                    m_rc = (o_r[:, None] < R) & (o_c[None, :] < V_LOCAL)
                    src = peer_logits + ((a0 - 1) * R + o_r[:, None]) * V_LOCAL + o_c[None, :]
                    dst = logits + o_r[:, None] * V + a0 * V_LOCAL + o_c[None, :]
                    tl.store(dst, tl.load(src, mask=m_rc), mask=m_rc)
            if ok:
                publish(rt, row, task, epoch, INTERPRET)
        n_done += 1
        if ahead == 0:
            task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok)
        else:
            task = tl.where(ok, nxt, -1)
    finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)


def build_table(
    rows: int,
    v_local: int,
    tp: int,
    block_n: int,
    handoff: str,
    gathers: str = "first",
    split: str = "tiles",
    grid: int = 1,
) -> TaskTable:
    """gathers "first": programs copy the peers' logits while the rows are normalized; "last": the copies
    fill the programs that run out of GEMV tasks at the end.

    split "tiles": GEMV tasks of block_n rows. "even": the rows dealt evenly over the programs left after the
    NORM tasks, the same number of tasks for each (up to block_n rows a task): no program streams a tile
    more than the others at the end of the launch (303 tiles of 64 rows over 396 programs at TP8 leave
    some SMs three and others one). With gathers "last", one program in 16 is also left out of the deal:
    those programs (and the NORM tasks' programs once done) copy the peers' logits while the others
    stream, instead of after them."""
    step = block_n
    if split == "even":
        spare = min(grid // SPARE_EVERY, (tp - 1) * triton.cdiv(v_local, GATHER_N)) if gathers == "last" else 0
        free = max(grid - rows - spare, 1)
        step = triton.cdiv(v_local, triton.cdiv(triton.cdiv(v_local, block_n), free) * free)
    t = TaskTable("tail", TYPE_NAMES, peers=tp - 1)

    def add_gathers() -> None:
        for peer in range(1, tp):
            for c0 in range(0, v_local, GATHER_N):
                g = t.add(GATHER, peer, c0)
                t.wait_peer(g, peer)

    norms = [t.add(NORM, r) for r in range(rows)]
    if gathers == "first":
        add_gathers()
    for n0 in range(0, v_local, step):
        g = t.add(GEMV, n0, min(step, v_local - n0))
        t.wait(g, norms, handoff)  # for ĥ before the stream, or (norm "fold") for 1/RMS after it
    if gathers == "last":
        add_gathers()
    return t


class TailLaunch:
    """One build key of `tail`: the table and buffers are laid out once; each call is one launch.

    tp > 1 runs rank 0's shard and gathers the peers' logits from `peer_logits` [tp-1, R, V/tp]."""

    def __init__(self, spec, tp: int, rows: int, knobs: dict, device, partial_only: bool = False) -> None:
        from glm53ctl.kernels.runtime import Runtime

        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.D, self.v_local = spec.hidden, spec.shards(tp).vocab
        self.partial_only = partial_only
        self.table = build_table(
            rows,
            self.v_local,
            1 if partial_only else tp,
            knobs["block_n"],
            knobs["handoff"],
            knobs["gathers"],
            knobs["split"],
            knobs["grid"],
        )
        self.grid = knobs["grid"]
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid)
        self.h_hat = torch.zeros(16, self.D, dtype=torch.bfloat16, device=device)
        self.rstd = torch.zeros(16, dtype=torch.float32, device=device)
        assert rows * spec.mhc.streams <= 32, "the folded GEMV pads H's stream rows to at most 32"

    def prepare_lm_head(self, norm_w: torch.Tensor, lm_w: torch.Tensor) -> torch.Tensor:
        """The lm_head shard as this launch reads it: folded with the norm weight under `norm` "fold"."""
        return fold_norm(norm_w, lm_w) if folds(self.knobs["norm"], self.rows, self.spec.mhc.streams) else lm_w

    @property
    def width(self) -> int:
        """Logits columns this launch writes: the full row, or a rank's slice for a partial launch."""
        return self.v_local * (1 if self.partial_only else self.tp)

    def kernel_args(self, H, norm_w, lm_w, logits, peer_logits, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS) -> dict:
        return self.runtime.args() | {
            "H": H,
            "norm_w": norm_w,
            "h_hat": self.h_hat,
            "rstd": self.rstd,
            "lm_w": lm_w,
            "logits": logits,
            "peer_logits": peer_logits,
            "R": self.rows,
            "eps": self.spec.model.rms_norm_eps,
            "n_tasks": self.table.n_tasks,
            "n_peers": self.table.peers,
            "n_programs": self.grid,
            "stuck_site": stuck_site,
            "budget_ns": budget_ns,
        }

    def constexprs(self) -> dict:
        return {
            "D": self.D,
            "HC": self.spec.mhc.streams,
            "V_LOCAL": self.v_local,
            "V": self.width,
            "BLOCK_N": self.knobs["block_n"],
            "BLOCK_K": min(self.knobs["block_k"], self.D),
            "INTERPRET": interpreting(),
            "POLL": self.knobs["poll"],
            "THREADS": 32 * self.knobs["warps"],
            "PREFETCH": self.knobs["prefetch"],
            "GATHER_COLS": GATHER_N,
            "NORM_FOLD": folds(self.knobs["norm"], self.rows, self.spec.mhc.streams),
            # the folded GEMV's rows are H's R * HC stream rows, padded to a `tl.dot` tile
            "M": 16 if self.rows * self.spec.mhc.streams <= 16 else 32,
        }

    def options(self) -> dict:
        return {"num_warps": self.knobs["warps"], "num_stages": self.knobs["stages"]}

    def __call__(self, H, norm_w, lm_w, peer_logits=None, out=None, stuck_site=-1, budget_ns=None, check=True):
        R, D = self.rows, self.D
        assert H.shape == (R, self.spec.mhc.streams, D) and H.dtype == torch.bfloat16 and H.is_contiguous()
        assert lm_w.shape == (self.v_local, D) and lm_w.is_contiguous()
        if self.tp > 1 and not self.partial_only:
            assert peer_logits is not None and peer_logits.shape == (self.tp - 1, R, self.v_local)
        else:
            peer_logits = H  # never read
        logits = out if out is not None else torch.empty(R, self.width, dtype=torch.float32, device=H.device)
        args = self.kernel_args(H, norm_w, lm_w, logits, peer_logits, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        tail_kernel[(self.grid,)](**args, **self.constexprs(), **self.options())
        if check:
            self.runtime.check()
        return logits

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        bf16, f32 = (torch.empty(1, dtype=d) for d in (torch.bfloat16, torch.float32))
        peers = f32 if self.tp > 1 and not self.partial_only else bf16  # __call__ passes H when no peers
        return self.kernel_args(bf16, bf16, bf16, f32, peers)
