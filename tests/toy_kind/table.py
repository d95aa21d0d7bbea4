"""The toy kind's tasks (the toy op's types, tests/toy_op/tasks.py): per row a Double (y[r] = 2 x[r]), and one Sum
that waits on every Double."""

from __future__ import annotations

from glm53ctl.kernels.runtime.table import TaskTable
from tests.toy_op.tasks import Double, Sum


def build_table(rows: int, handoff: str, sum_first: int = 0) -> TaskTable:
    t = TaskTable("toy", peers=0)
    total = t.add(Sum()) if sum_first else None
    doubles = [t.add(Double(r)) for r in range(rows)]
    if total is None:
        total = t.add(Sum())
    t.wait(total, doubles, handoff)
    return t
