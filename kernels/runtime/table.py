"""Host side of the launch runtime: the task table, laid out once per build key, and its buffers.

Tasks are added in topological order (a task waits only on earlier tasks or on peers), so claiming
them in order with an atomic counter is deadlock-free for any grid size, with no co-residency
assumption, and runs unchanged in the interpreter, which runs programs one after another.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from glm53ctl.kernels.runtime.device import BOX_WORDS, TASK_FIELDS
from glm53ctl.kernels.runtime.tasks import FIELDS, TYPES, Task, name_of

# a peer site polls flag words too, ones its peers write (with real ranks, from their own processes)
FLAG, BOX, PEER = 0, 1, 2
INT32_MAX = 2**31 - 1


@dataclass
class Site:
    task: int  # the waiting task
    kind: int  # FLAG, BOX or PEER
    index: int  # flag word, or box line
    count: int  # words polled
    producers: list[int]  # producer task ids (peers as -rank)
    late: bool = False  # waited at the end of the task's work (device.wait_task LATE), not before it


@dataclass
class TaskTable:
    """Tasks with their waits; `build` lays out the device arrays. Peers are ranks 1..tp-1 of a TP launch.

    Tables compose: a kind's builder appends its tasks to a table it is given, waiting on the producers of its
    inputs that it is told, and returns the tasks that produce its outputs; so one table can hold a whole
    step. `kind` names the launch in a LaunchFault."""

    kind: str = ""
    peers: int = 0
    # the rank each peer word stands for (real ranks: this rank's peers in rank order); None: ranks 1..peers
    peer_ranks: list[int] | None = None
    # peer words per group (0: one group of all `peers`): with real ranks a layer has two all-reduces, and each
    # peer tags each of them in a word of its own
    peer_group: int = 0
    tasks: list[tuple[int, int, int, int]] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)
    first_site: list[int] = field(default_factory=list)
    box_lines: int = 0
    # producer -> box words it must write when it publishes
    box_pubs: dict[int, list[int]] = field(default_factory=dict)
    # a stage's table (runtime/stages.py): each task's id in the whole launch's table, the id a fault names
    ids: list[int] | None = None
    # where the peer words start among the flag words (None: right after the tasks' words). A stage on real ranks
    # reads the words its peers write at the whole launch's place in its mailbox, its own words elsewhere
    peer_base: int | None = None

    def add(self, task: Task) -> int:
        """Append a task (a typed record of its op's tasks.py, kernels/runtime/tasks.py); its id in the table."""
        return self.add_row(task.row())

    def add_row(self, words: tuple[int, ...]) -> int:
        """Append a task as its row's first words (its type's id and its fields), as another table holds it (a
        stage's table copies the launch's rows: runtime/stages.py); its id."""
        ttype, *fields = words
        assert ttype in TYPES and len(fields) == FIELDS, words
        self.tasks.append((ttype, *fields))
        self.first_site.append(len(self.sites))
        return len(self.tasks) - 1

    def wait(
        self, task: int, producers: list[int], mechanism: str = "flag", words: int = BOX_WORDS, late: bool = False
    ) -> None:
        """The last-added task waits on producers (earlier tasks), by flag or by box (`words` producers per
        128-byte line: fewer words, more lines to poll, less contention per line). `late`: the task starts
        without them and waits at the end of its work (a task's late sites come after its early ones)."""
        assert 1 <= words <= BOX_WORDS
        assert task == len(self.tasks) - 1, "waits are added right after their task"
        assert all(p < task for p in producers), "a task waits only on earlier tasks (topological order)"
        assert late or not any(s.late for s in self.sites[self.first_site[task] :]), "early sites come first"
        if mechanism == "flag":
            for p in producers:
                self.sites.append(Site(task, FLAG, p, 1, [p], late))
        elif mechanism == "box":
            for i in range(0, len(producers), words):
                group = producers[i : i + words]
                line = self.box_lines
                self.box_lines += 1
                for slot, p in enumerate(group):
                    self.box_pubs.setdefault(p, []).append(line * BOX_WORDS + slot)
                self.sites.append(Site(task, BOX, line, len(group), group, late))
        else:
            raise ValueError(f"unknown hand-off mechanism {mechanism!r}")

    def wait_peer(self, task: int, rank: int) -> None:
        """Wait until peer `rank`'s partial has arrived (its flag word follows the tasks' words)."""
        assert 1 <= rank <= self.peers
        self.sites.append(Site(task, PEER, -rank, 1, [-rank]))

    def wait_peers(self, task: int, group: int = 0) -> None:
        """Wait until every peer's partial has arrived: one site polling their consecutive flag words at once
        (a site per peer cost an all-reduce a poll, a time check and a CTA-wide verdict per peer); `group`: the
        words of which group (`peer_group`)."""
        per = self.peer_group or self.peers
        assert self.peers >= 1 and task == len(self.tasks) - 1 and (group + 1) * per <= self.peers
        assert not any(s.late for s in self.sites[self.first_site[task] :]), "early sites come first"
        self.sites.append(Site(task, PEER, -1 - group * per, per, [-(group * per + q) for q in range(1, per + 1)]))

    @property
    def n_tasks(self) -> int:
        return len(self.tasks)

    @property
    def first_peer_word(self) -> int:
        """The flag word of the first peer: the tasks' words come first (a stage on real ranks: `peer_base`)."""
        return self.n_tasks if self.peer_base is None else self.peer_base

    def describe_task(self, t: int) -> str:
        if t < 0:
            i = (-t - 1) % (self.peer_group or self.peers or 1)  # the peer's place in its group
            return f"peer rank {self.peer_ranks[i] if self.peer_ranks else i + 1}"
        return f"task {t if self.ids is None else self.ids[t]} ({self.type_name(t)})"

    def type_name(self, t: int) -> str:
        return name_of(self.tasks[t][0])

    def sites_of(self, t: int) -> list[Site]:
        """Task t's wait sites, early then late."""
        end = self.first_site[t + 1] if t + 1 < self.n_tasks else len(self.sites)
        return self.sites[self.first_site[t] : end]

    def build(self, device: torch.device | str) -> dict[str, torch.Tensor]:
        n = self.n_tasks
        counts = [(self.first_site[i + 1] if i + 1 < n else len(self.sites)) - self.first_site[i] for i in range(n)]
        # peer words sit after the tasks' flag words (or at `peer_base`)
        index = [
            s.index if s.index >= 0 or s.kind == BOX else self.first_peer_word + (-s.index) - 1 for s in self.sites
        ]
        # a task's flag word is written only if some site waits on it (or the host may name it)
        flagged = {s.index for s in self.sites if s.kind == FLAG and s.index >= 0}
        pub_first, pub_slot = [], []
        for t in range(n):
            pub_first.append(len(pub_slot))
            pub_slot.extend(self.box_pubs.get(t, []))
        # a task's row (device.task_row): type, a0, a1, a2, first site, sites, publish flag, box words, first
        # word, then its first site's kind, index and words (so the kernel needs no second load to start), and
        # how many of its sites are early (the rest are late)
        rows = []
        for t in range(n):
            f, c = self.first_site[t], counts[t]
            first = (self.sites[f].kind, index[f], self.sites[f].count) if c else (0, 0, 0)
            pubs = (int(t in flagged), len(self.box_pubs.get(t, [])), pub_first[t])
            early = sum(not s.late for s in self.sites[f : f + c])
            row = [*self.tasks[t], f, c, *pubs, *first, early]
            rows.append(row + [0] * (TASK_FIELDS.value - len(row)))
        i32 = lambda xs: torch.tensor(xs or [0], dtype=torch.int32)
        arrays = {
            "tasks": torch.tensor(rows, dtype=torch.int32).reshape(-1),
            "wait_kind": i32([s.kind for s in self.sites]),
            "wait_index": i32(index),
            "wait_count": i32([s.count for s in self.sites]),
            "pub_slot": i32(pub_slot),
        }
        return {k: v.to(device) for k, v in arrays.items()}
