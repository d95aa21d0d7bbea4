"""The toy kernel: the runtime's claim loop over the toy's tasks (table.py); with ONE_TASK a stage launch's
one task per program, like every kind's kernel. DEFECT (tests/toy_kind/__init__.py `DEFECTS`): a planted defect."""

from __future__ import annotations

import triton
import triton.language as tl

from glm53ctl.kernels.runtime.device import (
    Claim,
    after_task,
    finish,
    first_task,
    launch_epoch,
    publish,
    row_sites,
    row_type,
    task_row,
    wait_task,
)
from glm53ctl.kernels.runtime.tasks import fields
from tests.toy_op.tasks import DOUBLE, SUM


@triton.jit(do_not_specialize=["stuck_site", "budget_ns"])
def toy_kernel(
    rt,
    x,
    y,
    top,
    total,
    scar,
    R,
    n_tasks,
    n_peers,
    n_programs,
    stuck_site,
    budget_ns,
    D: tl.constexpr,
    DEFECT: tl.constexpr,
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
        ttype = row_type(row)
        stuck = stuck_site
        if DEFECT == 9:  # silent: the guard is not told which site is stuck
            stuck = -1
        if DEFECT == 10:  # misnamed: the guard sticks the next of the sum's sites
            if stuck_site >= 0:
                first = row_sites(row)[0]
                stuck = first + (stuck_site - first + 1) % R
        if DEFECT == 8:  # unguarded: the stuck site's wait spins on a word that never comes, with no budget
            if (ttype == SUM) & (stuck_site >= 0):
                while tl.load(ctl) != -7:
                    pass
        ok = wait_task(Claim(rt, row, task, epoch, stuck, budget_ns), INTERPRET, POLL, THREADS, False)
        if ok:
            o_d = tl.arange(0, D)
            if ttype == DOUBLE:
                r = fields(row, DOUBLE)
                v = 2.0 * tl.load(x + r * D + o_d)
                if DEFECT == 1:  # accuracy
                    v += tl.where(r == 0, 0.25, 0.0)
                if DEFECT == 11:  # scarred: what a faulted launch left behind
                    v += tl.load(scar)
                tl.store(y + r * D + o_d, v)
                best = tl.argmax(v, axis=0)
                if DEFECT == 4:  # invariant
                    best = (best + 1) % D
                if (DEFECT != 3) | (r != R - 1):  # unwritten
                    tl.store(top + r, best)
            else:  # SUM, once every DOUBLE published
                for i in range(R):
                    s = tl.sum(tl.load(y + i * D + o_d))
                    if DEFECT == 2:  # nan
                        s = tl.where(i == 0, float("nan"), s)
                    if DEFECT == 5:  # grids
                        s = tl.where(n_programs % 2 == 1, s * (1.0 + 1.1920929e-07), s)
                    if DEFECT == 6:  # repeats
                        s = tl.where(epoch % 2 == 0, s * (1.0 + 1.1920929e-07), s)
                    if (DEFECT != 3) | (i != R - 1):  # unwritten
                        tl.store(total + i, s)
            publish(rt, row, task, epoch, INTERPRET)
        elif DEFECT == 11:  # scarred
            tl.store(scar, 1.0)
        n_done += 1
        task = after_task(ctl, n_tasks, n_done, n_programs, INTERPRET, ok, ONE_TASK)
    finish(ctl, flags, n_tasks, n_peers, n_programs, epoch)
