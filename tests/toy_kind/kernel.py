"""The toy kernel: the runtime's claim loop over the toy's tasks (table.py); with ONE_TASK a stage launch's
one task per program, like every kind's kernel."""

from __future__ import annotations

import triton
import triton.language as tl

from glm53ctl.kernels.runtime.device import after_task, finish, first_task, launch_epoch, publish, task_row, wait_task


@triton.jit(do_not_specialize=["stuck_site", "budget_ns"])
def toy_kernel(
    rt,
    x,
    y,
    total,
    R,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    D: tl.constexpr,
    INTERPRET: tl.constexpr,
    POLL: tl.constexpr,
    THREADS: tl.constexpr,
    PDL: tl.constexpr,
    ONE_TASK: tl.constexpr,
):
    ctl, flags = rt.ctl, rt.flags
    epoch = launch_epoch(ctl, INTERPRET)
    n_done = 0
    task = first_task(ctl, n_tasks, n_programs, INTERPRET, ONE_TASK)
    while task >= 0:
        row = task_row(rt, task)
        what, r = row[1], row[2]
        ok = wait_task(rt, row, task, epoch, stuck_site, budget_ns, INTERPRET, POLL, THREADS, False)
        if ok:
            o_d = tl.arange(0, D)
            if what == 0:  # DOUBLE
                tl.store(y + r * D + o_d, 2.0 * tl.load(x + r * D + o_d))
            else:  # SUM, once every DOUBLE published
                for i in range(R):
                    tl.store(total + i, tl.sum(tl.load(y + i * D + o_d)))
            publish(rt, row, task, epoch, INTERPRET)
        n_done += 1
        task = after_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok, ONE_TASK)
    finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)
