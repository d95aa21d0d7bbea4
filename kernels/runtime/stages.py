"""The separate-launches baseline, for any kind: the same task bodies as one launch per stage.

A persistent launch must beat its own stages launched one after another (docs/design.md §8). A stage is a set of
task types; its launch runs those tasks of the kind's table, waiting only on each other (the launch before it
has ended, so every other producer is done), in the whole launch's buffers: the same bits, launch by launch.
A kind's launch gets this by having `table`, `grid` and `runtime` attributes (every kind's launch has them):
`stage_launch` copies it with a stage's table and a runtime of its own, sharing every buffer. A launch with
words that belong to one launch alone (dense's arrival words, tagged with its runtime's epochs) defines
`stage(ttypes)` to give the copy its own.
"""

from __future__ import annotations

import copy

from glm53ctl.kernels.runtime.table import FLAG, TaskTable


def stage_table(full: TaskTable, ttypes) -> TaskTable:
    """The tasks of `full` whose type is in `ttypes`, with the waits among them (waits on tasks of other stages,
    or on peers, are dropped: those producers are done before the stage's launch)."""
    types = {int(getattr(t, "value", t)) for t in ttypes}
    t = TaskTable(full.kind)
    new = {}
    for i, task in enumerate(full.tasks):
        if task[0] not in types:
            continue
        new[i] = t.add(*task)
        for s in full.sites_of(i):
            inside = [new[p] for p in s.producers if p in new]
            assert len(inside) in (0, len(s.producers)), "a site waits on one stage"
            if inside:
                t.wait(new[i], inside, "flag" if s.kind == FLAG else "box", late=s.late)
    return t


def stage_launch(whole, ttypes):
    """A copy of the launch `whole` that runs one stage: the same buffers (shared, not copied), the stage's
    table, at most one program per task, and a runtime of its own (its tag moves with its own launches)."""
    from glm53ctl.kernels.runtime.launch import Runtime

    stage = copy.copy(whole)
    stage.table = stage_table(whole.table, ttypes)
    assert stage.table.n_tasks, f"no task of types {ttypes} in the table"
    stage.grid = min(whole.grid, stage.table.n_tasks)
    stage.runtime = Runtime(stage.table, whole.runtime.device, max_programs=stage.grid)
    return stage


class SeparateLaunches:
    """A kind's launch as one launch per stage, in order: called like the launch, it returns what the last
    stage's launch returns. `pdl`: each stage launch chained to the one before by programmatic dependent launch
    (the separate-pdl baseline): it starts while the launch before it ends, asks L2 for its first task's
    weights, then waits for that launch's writes (runtime/device.py pdl_enter)."""

    def __init__(self, whole, stages, pdl: bool = False) -> None:
        self.whole = whole
        make = getattr(whole, "stage", None) or (lambda ttypes: stage_launch(whole, ttypes))
        self.stages = [make(s) for s in stages]
        for s in self.stages:
            s.pdl = pdl

    def __call__(self, *args, **kwargs):
        for s in self.stages:
            out = s(*args, **kwargs)
        return out

    def __getattr__(self, name: str):
        # the whole launch's buffers and facts (outputs, table, grid) stand for the stages'
        return getattr(self.whole, name)
