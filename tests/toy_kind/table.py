"""The toy kind's tasks: per row a DOUBLE (y[r] = 2 x[r]), and one SUM that waits on every DOUBLE."""

from __future__ import annotations

from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.runtime.task_types import HOP

DOUBLE, SUM = 0, 1  # a task's first argument: which of the two it is


def build_table(rows: int, handoff: str, sum_first: int = 0) -> TaskTable:
    t = TaskTable("toy", peers=0)
    total = t.add(HOP, SUM) if sum_first else None
    doubles = [t.add(HOP, DOUBLE, r) for r in range(rows)]
    if total is None:
        total = t.add(HOP, SUM)
    t.wait(total, doubles, handoff)
    return t
