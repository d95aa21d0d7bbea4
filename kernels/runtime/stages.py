"""A kind's launch as one launch per stage: the separate-launches baselines and the stage schedule (knob `launch`).

A stage is a set of task types; its launch runs those tasks of the kind's table, waiting only on each other and on
the peers (the launch before it has ended, so every other producer is done), in the whole launch's buffers: the
same task bodies, so the same bits, launch by launch.

- `separate` (a baseline): the stages launched one after another, each claim loop as the whole launch's.
- `separate-pdl` (a baseline): chained by programmatic dependent launch; each stage asks L2 for its first tile,
  waits for the launch before it, then lets the next one start.
- the stage schedule (`launch=stages`): one program per task and no claim loop; each program lets the next launch
  start at its entry, issues its weight tile, then waits for the launch before it (`gdc_wait`) and reads its
  input. The launches chain down the whole step, so a stage's weights stream while the stage before it drains.
  In the interpreter the PDL calls are off and the stages are ordinary launches, so CI proves their bits.

A kind's launch gets this by having `table`, `grid` and `runtime` attributes (every kind's launch has them):
`stage_launch` copies it with a stage's table and a runtime of its own, sharing every buffer. A launch with
words that belong to one launch alone (dense's arrival words, tagged with its runtime's epochs) defines
`stage(ttypes, one_task)` to give the copy its own.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

from glm53ctl.kernels.runtime.launch import LaunchFault, Runtime
from glm53ctl.kernels.runtime.table import FLAG, PEER, Site, TaskTable


def stage_table(full: TaskTable, ttypes) -> TaskTable:
    """The tasks of `full` whose type is in `ttypes`, with the waits among them and on the peers (waits on tasks
    of other stages are dropped: those producers are done before the stage's launch). Its `ids` are the tasks'
    ids in `full`."""
    types = {int(getattr(t, "value", t)) for t in ttypes}
    t = TaskTable(full.kind, peers=full.peers, peer_ranks=full.peer_ranks, peer_group=full.peer_group, ids=[])
    new = {}
    for i, task in enumerate(full.tasks):
        if task[0] not in types:
            continue
        new[i] = t.add_row(task)
        t.ids.append(i)
        for s in full.sites_of(i):
            if s.kind == PEER:  # a peer's partial: still a wait on real ranks
                t.sites.append(Site(new[i], PEER, s.index, s.count, list(s.producers), s.late))
                continue
            inside = [new[p] for p in s.producers if p in new]
            assert len(inside) in (0, len(s.producers)), "a site waits on one stage"
            if inside:
                t.wait(new[i], inside, "flag" if s.kind == FLAG else "box", late=s.late)
    return t


def stage_launch(whole, ttypes, one_task: bool = False):
    """A copy of the launch `whole` that runs one stage: the same buffers (shared, not copied), the stage's
    table, a runtime of its own (its tag moves with its own launches), and at most one program per task
    (`one_task`: exactly one, with no claim loop).

    On real ranks (`whole.links`) a stage that waits on the peers reads their words where they write them, after
    the whole table's words in this rank's flag mailbox (every stage's pushes tag that place: the launch's
    `peer_words`), and keeps its own words in a place of its own below them, so that no stage reads another
    stage's words as its own (their tags move in step)."""

    stage = copy.copy(whole)
    stage.table = t = stage_table(whole.table, ttypes)
    assert t.n_tasks, f"no task of types {ttypes} in the table"
    stage.grid = t.n_tasks if one_task else min(whole.grid, t.n_tasks)
    stage.one_task = one_task
    flags = None
    links = getattr(whole, "links", None)
    if links is not None and any(s.kind == PEER for s in t.sites):
        places = whole.__dict__.setdefault("_stage_words", {})  # stage types -> (first word, words)
        name = tuple(sorted(int(getattr(x, "value", x)) for x in ttypes))
        at = places[name][0] if name in places else max((a + n for a, n in places.values()), default=0)
        places[name] = (at, t.n_tasks)
        assert at + t.n_tasks <= whole.table.n_tasks, "the stages' own words fit below the peers' words"
        t.peer_base = whole.table.n_tasks - at
        flags = links.flags.local[at:]
    stage.runtime = Runtime(t, whole.runtime.device, max_programs=stage.grid, flags=flags)
    return stage


class StageRuntime:
    """The stages' runtimes as `check` and `fault` read one launch's: `epoch` (the launches every stage ran),
    `check()` (the first stage's fault, if any, with its site numbered among all the stages' sites)."""

    def __init__(self, launches: SeparateLaunches) -> None:
        self.launches = launches

    @property
    def epoch(self) -> int:
        return min(s.runtime.epoch for s in self.launches.stages)

    def check(self) -> None:
        faults = []
        for j, s in enumerate(self.launches.stages):
            try:
                s.runtime.check()  # each stage's check clears its record: every stage checked, the first named
            except LaunchFault as e:
                faults.append((j, e))
        if faults:
            j, e = faults[0]
            site = self.launches.offsets[j] + e.site
            raise LaunchFault(e.kind, site, e.task, e.producer, e.program, e.expected, e.seen)


class SeparateLaunches:
    """A kind's launch as one launch per stage, in order: called like the launch, it returns what the last
    stage's launch returns. `pdl`: each stage launch chained to the one before by programmatic dependent launch.
    `one_task`: the stage schedule (module doc). Its `table.sites` are the stages' sites in stage order (what
    `fault --site` numbers), its `runtime` the stages' (StageRuntime)."""

    def __init__(self, whole, stages, pdl: bool = False, one_task: bool = False) -> None:
        self.whole = whole
        make = getattr(whole, "stage", None) or (lambda ttypes, one: stage_launch(whole, ttypes, one))
        self.stages = [make(s, one_task) for s in stages]
        left = sorted(
            {whole.table.type_name(i) for i in range(whole.table.n_tasks)}
            - {s.table.type_name(t) for s in self.stages for t in range(s.table.n_tasks)}
        )
        if left:  # a task in no stage would never run, and whatever waits on it (a peer, say) would fault
            raise ValueError(f"the stages of {whole.table.kind} leave its {', '.join(left)} tasks unrun")
        self.offsets, sites = [], []
        for s in self.stages:
            s.pdl = pdl
            self.offsets.append(len(sites))
            sites += s.table.sites
        self.table = SimpleNamespace(sites=sites, n_tasks=whole.table.n_tasks, tasks=whole.table.tasks)
        self.runtime = StageRuntime(self)

    def locate(self, site: int) -> tuple[int, int]:
        """The stage holding site `site` of the stages' sites, and the site's number in that stage's table."""
        if not 0 <= site < len(self.table.sites):
            raise IndexError(f"site {site}: the stages have sites 0..{len(self.table.sites) - 1}")
        j = max(i for i, off in enumerate(self.offsets) if off <= site and self.stages[i].table.sites)
        return j, site - self.offsets[j]

    def __call__(self, *args, stuck_site: int = -1, check: bool = True, **kwargs):
        """Every stage's launch, the stuck site (if any) stuck in its own; with `check`, the host's check after
        the last one (none between them: a stage launch is queued behind the one before, not synchronized)."""
        at = self.locate(stuck_site) if stuck_site >= 0 else (-1, -1)
        for j, s in enumerate(self.stages):
            out = s(*args, stuck_site=at[1] if j == at[0] else -1, check=False, **kwargs)
        if check:
            self.runtime.check()
        return out

    @property
    def tracing(self) -> bool:
        return self.stages[0].tracing

    @tracing.setter
    def tracing(self, on: bool) -> None:
        for s in self.stages:
            s.tracing = on

    def trace_record(self):
        """The traced launch's records (runtime/trace.py) in the whole table's task ids, with the whole table:
        its waits are the data the stages hand on, whatever launch boundary lies between."""
        import torch

        whole = self.whole.table
        trace = torch.zeros(whole.n_tasks, 5, dtype=torch.int64)
        for s in self.stages:
            trace[s.table.ids] = s.buf["trace"].cpu()
        return whole, trace

    def __getattr__(self, name: str):
        # the whole launch's buffers and facts (outputs, grid, knobs) stand for the stages'
        return getattr(self.whole, name)


def on_rank(launch, stages):
    """A rank's launch on real ranks in its key's schedule (knob `launch`): as it is, or as the given stages
    (which hold the tasks that push: a layer's `push_stages`), one program per task, chained by programmatic
    dependent launch, the stages that wait on the peers reading their words in the rank's mailbox."""
    if launch.knobs.get("launch", "persistent") != "stages":
        return launch
    return SeparateLaunches(launch, stages, pdl=True, one_task=True)
