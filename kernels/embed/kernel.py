"""The `embed` launch: vocab-parallel gather, the all-reduce over ranks, the 4-stream H.

Tasks: GATHER (a D-chunk of this rank's rows for the tokens it owns, zero elsewhere; fp32 partial),
REDUCE (the same chunk: waits on its GATHER by flag or box and on every peer's partial, sums in rank
order, writes H[r, j, chunk] for every stream j). `partial_only` lays out GATHER tasks alone: that is
how the harness computes a peer rank's partial with the same code.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.runtime.device import (
    finish,
    launch_epoch,
    next_task,
    publish,
    runtime_buffers,
    task_row,
    wait_task,
)
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS
from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.tlx import interpreting

GATHER, REDUCE = 0, 1
TYPE_NAMES = {GATHER: "gather", REDUCE: "reduce"}


@triton.jit(do_not_specialize=["stuck_site", "budget_ns"])
def embed_kernel(
    ctl,
    flags,
    boxes,
    errs,
    tasks,
    wait_kind,
    wait_index,
    wait_count,
    pub_slot,
    tokens,
    table,
    partial,
    peer_partials,
    H,
    R,
    vocab_offset,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    D: tl.constexpr,
    HC: tl.constexpr,
    V_LOCAL: tl.constexpr,
    TP: tl.constexpr,
    CHUNK: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    rt = runtime_buffers(ctl, flags, boxes, errs, tasks, wait_kind, wait_index, wait_count, pub_slot)
    epoch = launch_epoch(ctl, INTERPRET)
    n_done = 0
    task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET)
    while task >= 0:
        row = task_row(rt, task)
        ttype, d0 = row[0], row[1]
        ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, False)
        if ok:
            o_d = d0 + tl.arange(0, CHUNK)
            for r in range(R):
                if ttype == 0:
                    local = tl.load(tokens + r) - vocab_offset
                    mine = (local >= 0) & (local < V_LOCAL)
                    e_row = tl.where(mine, local, 0).to(tl.int64)
                    b_e = tl.load(table + e_row * D + o_d, mask=(o_d < D) & mine, other=0.0).to(tl.float32)
                    tl.store(partial + r * D + o_d, b_e, mask=o_d < D)
                else:
                    # the all-reduce: rank 0's partial, then the peers', in rank order (as the reference)
                    b_s = tl.load(partial + r * D + o_d, mask=o_d < D, other=0.0)
                    for p in range(TP - 1):
                        b_s += tl.load(peer_partials + (p * R + r) * D + o_d, mask=o_d < D, other=0.0)
                    for j in range(HC):
                        tl.store(H + (r * HC + j) * D + o_d, b_s.to(tl.bfloat16), mask=o_d < D)
            publish(rt, row, task, epoch, INTERPRET)
        n_done += 1
        task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok)
    finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)


def build_table(D: int, chunk: int, tp: int, handoff: str, partial_only: bool) -> TaskTable:
    t = TaskTable("embed", TYPE_NAMES, peers=0 if partial_only else tp - 1)
    for d0 in range(0, D, chunk):
        g = t.add(GATHER, d0)
        if partial_only:
            continue
        r = t.add(REDUCE, d0)
        t.wait(r, [g], handoff)
        if tp > 1:
            t.wait_peers(r)
    return t


class EmbedLaunch:
    """One build key of `embed` (rank 0 of TP `tp`, or with partial_only a rank's partial alone)."""

    def __init__(self, spec, tp: int, rows: int, knobs: dict, device, partial_only: bool = False) -> None:
        from glm53ctl.kernels.runtime import Runtime

        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.D, self.v_local = spec.hidden, spec.shards(tp).vocab
        self.chunk = min(knobs["chunk"], self.D)
        self.partial_only = partial_only
        self.table = build_table(self.D, self.chunk, tp, knobs["handoff"], partial_only)
        self.grid = knobs["grid"]
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid)
        self.partial = torch.zeros(rows, self.D, dtype=torch.float32, device=device)

    def kernel_args(self, tokens, table, peer_partials, H, rank=0, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS):
        return self.runtime.args() | {
            "tokens": tokens,
            "table": table,
            "partial": self.partial,
            "peer_partials": peer_partials,
            "H": H,
            "R": self.rows,
            "vocab_offset": rank * self.v_local,
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
            "TP": 1 if self.partial_only else self.tp,
            "CHUNK": self.chunk,
            "INTERPRET": interpreting(),
            "POLL": self.knobs["poll"],
            "THREADS": 32 * self.knobs["warps"],
        }

    def options(self) -> dict:
        return {"num_warps": self.knobs["warps"]}

    def __call__(self, tokens, table, peer_partials=None, rank=0, out=None, stuck_site=-1, budget_ns=None, check=True):
        """H [R, hc, D] bf16 (or with partial_only, this rank's fp32 partial [R, D])."""
        from glm53ctl.kernels.embed.naive import check_tokens

        R, D = self.rows, self.D
        assert tokens.shape == (R,) and table.shape == (self.v_local, D) and table.is_contiguous()
        if not (tokens.is_cuda and torch.cuda.is_current_stream_capturing()):  # a graph cannot sync
            check_tokens(tokens.cpu(), self.spec.model.vocab_size)
        tokens = tokens.to(torch.int32)
        if not self.partial_only and self.tp > 1:
            assert peer_partials is not None and peer_partials.shape == (self.tp - 1, R, D)
        H = (
            out
            if out is not None
            else torch.empty(R, self.spec.mhc.streams, D, dtype=torch.bfloat16, device=table.device)
        )
        peers = peer_partials if peer_partials is not None else self.partial
        args = self.kernel_args(tokens, table, peers, H, rank, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        embed_kernel[(self.grid,)](**args, **self.constexprs(), **self.options())
        if check:
            self.runtime.check()
        return self.partial.clone() if self.partial_only else H

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        i32, bf16, f32 = (torch.empty(1, dtype=d) for d in (torch.int32, torch.bfloat16, torch.float32))
        return self.kernel_args(i32, bf16, f32, bf16)
