"""Running a persistent launch: its buffers, the launch guard on the host, and `LaunchFault`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from glm53ctl.errors import CheckFailed
from glm53ctl.kernels.runtime.device import BOX_WORDS, CTL_WORDS
from glm53ctl.kernels.runtime.table import INT32_MAX, TaskTable
from glm53ctl.kernels.tlx import interpreting

ARRAYS = ("tasks", "wait_kind", "wait_index", "wait_count", "pub_slot")


class RuntimeBuffers(NamedTuple):
    """The runtime's buffers, every kind's kernel's first argument (`rt`): the control words (tag, claim counter,
    ...: device.py), the flag words, the box lines, the error records, and the table's arrays."""

    ctl: Any
    flags: Any
    boxes: Any
    errs: Any
    tasks: Any
    wait_kind: Any
    wait_index: Any
    wait_count: Any
    pub_slot: Any


# a slow but healthy launch never waits this long on one hand-off; configurable per launch
DEFAULT_BUDGET_NS = 200_000_000


def on_device(args: dict, device) -> dict:
    """A launch's arguments (placeholder_args) with every tensor moved to `device`, in its groups too."""

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, tuple):
            moved = [move(x) for x in v]
            return type(v)(*moved) if hasattr(v, "_fields") else tuple(moved)
        return v

    return {n: move(v) for n, v in args.items()}


class LaunchFault(CheckFailed):
    """A guarded wait timed out: names the root site (the lowest task among those that timed out)."""

    def __init__(self, kind: str, site: int, task: str, producer: str, program: int, expected: int, seen: int):
        super().__init__(
            f"{kind} launch fault at site {site}: {task} waited for {producer} "
            f"(program {program}, expected epoch {expected}, saw {seen})",
            hint="`glm53ctl fault --site N` sticks one site on purpose",
        )
        self.kind, self.site, self.task, self.producer = kind, site, task, producer
        self.program, self.expected, self.seen = program, expected, seen


@dataclass
class Runtime:
    """The device buffers of one build key's table; reused launch after launch with no host reset."""

    table: TaskTable
    device: torch.device
    max_programs: int
    # real ranks: the flag words live in this rank's mailbox, where its peers write their words (zeroed)
    flags: torch.Tensor | None = None

    def __post_init__(self) -> None:
        t, dev = self.table, self.device
        self.arrays = t.build(dev)
        # tag, claim counter, programs done, abort epoch, lowest timed-out task, and the host's copies of the
        # last two (see runtime/device.py)
        self.ctl = torch.zeros(CTL_WORDS.value + t.n_tasks, dtype=torch.int32, device=dev)
        self.ctl[4] = INT32_MAX
        self.ctl[6] = INT32_MAX
        self.ctl[CTL_WORDS.value :] = torch.arange(t.n_tasks, dtype=torch.int32)  # the interpreter's claim order
        # tasks' flag words, then one word per peer: a peer's partial is in place before the launch,
        # so its word holds the epoch the next launch expects (the last program keeps it so)
        if self.flags is None:
            self.flags = torch.zeros(t.first_peer_word + t.peers, dtype=torch.int32, device=dev)
            self.flags[t.first_peer_word :] = 1
        else:
            assert self.flags.shape == (t.first_peer_word + t.peers,) and self.flags.dtype == torch.int32
        self.boxes = torch.zeros(max(t.box_lines, 1) * BOX_WORDS, dtype=torch.int32, device=dev)
        self.errs = torch.zeros(self.max_programs, 5, dtype=torch.int32, device=dev)

    def shuffle(self, seed: int) -> list[int]:
        """In the interpreter, claim the tasks in a random topological order of the table's waits (early and
        late) instead of table order: a task that reads from a producer it does not wait on may then run first
        and read what is not there yet. The GPU claims in table order whatever this says. Returns the order."""
        import random

        rng = random.Random(seed)
        t = self.table
        consumers: list[list[int]] = [[] for _ in range(t.n_tasks)]
        missing = [0] * t.n_tasks
        for s in t.sites:
            for p in s.producers:
                if p >= 0:
                    consumers[p].append(s.task)
                    missing[s.task] += 1
        ready = [i for i in range(t.n_tasks) if missing[i] == 0]
        order = []
        while ready:
            i = ready.pop(rng.randrange(len(ready)))
            order.append(i)
            for c in consumers[i]:
                missing[c] -= 1
                if missing[c] == 0:
                    ready.append(c)
        assert len(order) == t.n_tasks, "the waits have a cycle"
        self.ctl[CTL_WORDS.value :] = torch.tensor(order, dtype=torch.int32)
        return order

    def args(self) -> dict[str, RuntimeBuffers]:
        """The runtime's kernel argument (every launch kind's kernel starts with it)."""
        a = self.arrays
        return {"rt": RuntimeBuffers(self.ctl, self.flags, self.boxes, self.errs, *(a[name] for name in ARRAYS))}

    def check(self) -> None:
        """After a launch: raise LaunchFault naming the root site of the last faulted launch (ctl[5] its
        epoch, ctl[6] its lowest timed-out task, moved there by its last program), then clear them."""
        ctl = self.ctl.cpu()
        epoch, root_task = int(ctl[5]), int(ctl[6])
        if epoch == 0:
            return
        rows = [r for r in self.errs.cpu().tolist() if r[1] == root_task and r[3] == epoch]
        site, task, program, expected, seen = rows[0] if rows else (-1, root_task, -1, epoch, 0)
        self.ctl[5] = 0
        self.ctl[6] = INT32_MAX
        self.errs.zero_()
        s = self.table.sites[site] if site >= 0 else None
        producers = s.producers if s else []
        if producers and all(p < 0 for p in producers):  # the peers whose words never came: those named
            words = self.flags[self.table.first_peer_word :].cpu().tolist()
            late = [p for p in producers if words[-p - 1] not in (epoch, epoch + 1)]
            producers = late or producers
        producer = ", ".join(self.table.describe_task(p) for p in producers) if s else "?"
        raise LaunchFault(self.table.kind, site, self.table.describe_task(task), producer, program, expected, seen)

    @property
    def epoch(self) -> int:
        """The epoch of the last finished launch (tests: it advances by one per launch)."""
        return int(self.ctl[0])


class PersistentLaunch:
    """What every kind's launch class shares (it sets `kernel`, `table`, `grid`, `runtime` and `knobs`): the
    runtime's kernel arguments and constexprs, the compile options of the knobs every kind takes, and one
    launch with the host side of the guard after it. `pdl`: launched chained to the launch before it by
    programmatic dependent launch (a stage of the separate-pdl baseline; its kernel calls `pdl_enter` first);
    the interpreter has no such launch and ignores it. `one_task`: a launch of the stage schedule (knob `launch`,
    runtime/stages.py), one program per task and no claim loop."""

    pdl = False
    one_task = False

    def runtime_args(self, stuck_site: int, budget_ns: int) -> dict:
        return self.runtime.args() | {
            "n_tasks": self.table.n_tasks,
            "n_peers": self.table.peers,
            "n_programs": self.grid,
            "stuck_site": stuck_site,
            "budget_ns": budget_ns,
        }

    def runtime_constexprs(self) -> dict:

        return {
            "INTERPRET": interpreting(),
            "POLL": self.knobs.poll,
            "THREADS": 32 * self.knobs.warps,
            "PDL": self.pdl and not interpreting(),
            "ONE_TASK": self.one_task,
        }

    def options(self) -> dict:
        """Compile options from the knobs: warps, and the K loop's pipelining depth where the kind takes it; and
        `launch_pdl` for a launch chained by programmatic dependent launch (Triton keys its builds on it too, so
        an ahead-of-time warmup without it would build a variant that never runs)."""

        opts = {"num_warps": self.knobs.warps}
        if "stages" in self.knobs:
            opts["num_stages"] = self.knobs.stages
        if self.pdl and not interpreting():
            opts["launch_pdl"] = True
        return opts

    def launch(self, args: dict, check: bool) -> None:
        """One launch over the grid; with `check`, raise LaunchFault if a guarded wait timed out."""
        self.kernel[(self.grid,)](**args, **self.constexprs(), **self.options())
        if check:
            self.runtime.check()
