"""A chain of dependent no-op tasks on the runtime: measures the latency of one hand-off (docs/design.md §8 floors)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.runtime import Runtime
from glm53ctl.kernels.runtime.device import (
    Claim,
    finish,
    launch_epoch,
    next_task,
    publish,
    task_row,
    wait_task,
)
from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.runtime.tasks import Hop
from glm53ctl.kernels.tlx import interpreting


@triton.jit(do_not_specialize=["stuck_site", "budget_ns"])
def chain_kernel(
    rt,
    n_tasks,
    n_programs,
    stuck_site,
    budget_ns,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
):
    ctl, flags = rt.ctl, rt.flags  # the runtime's buffers (runtime/launch.py RuntimeBuffers)
    epoch = launch_epoch(ctl, INTERPRET)
    n_done = 0
    task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET)
    while task >= 0:
        row = task_row(rt, task)
        ok = wait_task(Claim(rt, row, task, epoch, stuck_site, budget_ns), INTERPRET, POLL, THREADS, False)
        if ok:
            publish(rt, row, task, epoch, INTERPRET)
        n_done += 1
        task = next_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok)
    finish(ctl, flags, n_tasks, 0, n_programs, epoch)


class ChainLaunch:
    """n tasks, task i waiting on task i-1 by flag or box: one launch is n dependent hand-offs."""

    def __init__(self, n: int, handoff: str, poll: int, grid: int, device) -> None:

        t = TaskTable("chain")
        prev = t.add(Hop())
        for _ in range(n - 1):
            cur = t.add(Hop())
            t.wait(cur, [prev], handoff)
            prev = cur
        self.table, self.poll, self.grid = t, poll, grid
        self.runtime = Runtime(t, torch.device(device), max_programs=grid)

    def __call__(self, stuck_site: int = -1, budget_ns: int = 200_000_000, check: bool = True) -> None:
        chain_kernel[(self.grid,)](
            **self.runtime.args(),
            n_tasks=self.table.n_tasks,
            n_programs=self.grid,
            stuck_site=stuck_site,
            budget_ns=budget_ns,
            INTERPRET=interpreting(),
            POLL=self.poll,
            THREADS=128,
            num_warps=4,
        )
        if check:
            self.runtime.check()
