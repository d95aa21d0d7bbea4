"""Real tensor parallelism: one process per rank, and each rank's mailbox that its peers write into.

A TP-T launch on one GPU runs rank 0's shard and reads its peers' partials from same-GPU stand-ins (the
emulation). With real ranks every rank runs its own launch in its own process; an all-reduce is a push: each
rank writes its partial into slot `rank` of every peer's mailbox, then its tag into that peer's flag word for it
(`Mailbox`), and each rank's reduce waits on its own flag words and sums the slots in rank order, the order of
the emulation, so every rank's result is the emulation's bit for bit. Pushing keeps every poll local (a rank
polls its own memory, never a peer's across the link) and leaves the reduce body and the guarded wait as they
are: the guard names the peer that never published.

- `RankLayout`: which device each rank runs on (`--gpus N`: N = 1, the emulation, or N = T, a rank per GPU).
- `run_ranks`: spawns the ranks (NVLink multicast off in each), sets up what they meet through (on GPUs
  `torch.distributed` with NCCL, which symmetric memory needs; on the CPU a file store in the run's folder, with
  no sockets: gloo's TCP mesh failed to connect now and then on a loaded CI machine), for set-up and barriers
  only: nothing of a launch goes through it; runs a function on every rank and gathers the results on the
  caller; a rank that raises is named; a rank that hangs is killed at the timeout.
- `Mailbox`: a rank's buffers its peers write into. On the CPU, shared-memory files mapped by every rank (what
  CI tests, under the interpreter: the ranks' launches really run concurrently and poll each other's writes);
  on GPUs, torch symmetric memory (not yet run: no machine with several GPUs was lent; see docs/perf/ranks.md).
"""

from __future__ import annotations

import io
import os
import signal
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import torch

from glm53ctl.errors import CheckFailed, UsageError
from glm53ctl.kernels.runtime.launch import LaunchFault, on_device
from glm53ctl.kernels.weights import Weights, load_weights

# the longest a rank waits at a CPU barrier for its peers (a peer that never comes has failed or hangs, and the
# launcher kills every rank at its own timeout first)
STORE_WAIT_S = 3600

# how far into its launch a rank is killed (`fault --gpus`): its launch runs (its pushes under way), its tag never out
KILL_AFTER_S = 0.05

# NVLink multicast stays off (docs/design.md; the machines' KINDS.md): in this process and every child
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class RankLayout:
    """Where the ranks of a TP-T key run: `gpus` 1 is the one-device emulation (rank 0's launch, its peers'
    partials made first on the same device); `gpus` T is one rank per GPU (or, on a CPU, one process per rank)."""

    tp: int
    gpus: int = 1
    device_type: str = "cuda"

    def __post_init__(self) -> None:
        if self.gpus not in (1, self.tp):
            raise UsageError(
                f"--gpus {self.gpus} at TP{self.tp}: one rank per GPU (--gpus {self.tp}) or the one-GPU "
                "emulation (--gpus 1)"
            )
        if self.device_type == "cuda" and self.gpus > 1:
            have = torch.cuda.device_count()
            if have < self.gpus:
                raise UsageError(f"--gpus {self.gpus}: this machine has {have} GPU(s)")

    @property
    def real(self) -> bool:
        """Whether each rank runs in its own process (else the emulation)."""
        return self.gpus > 1

    def device(self, rank: int) -> torch.device:
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device("cuda", rank if self.real else 0)


class RankFailed(CheckFailed):
    """A rank raised, or did not finish in time: names the rank and what it said."""


@dataclass
class Group:
    """What a rank's function is given: its rank, the world size, its device, and where the mailboxes live."""

    rank: int
    world: int
    device: torch.device
    folder: Path  # the CPU mailboxes' files
    store: object | None = None  # on the CPU, a torch.distributed.FileStore the ranks meet through; else NCCL
    _barriers: int = 0

    def barrier(self) -> None:
        """Every rank waits here until all have come."""
        if self.store is None:
            torch.distributed.barrier()
            return
        self._barriers += 1
        key = f"barrier{self._barriers}"
        if self.store.add(key, 1) == self.world:  # the last to come opens it
            self.store.set(f"{key}.open", "1")
        self.store.wait([f"{key}.open"])


def _child(rank: int, world: int, layout: RankLayout, folder: str, init: str, fn, args, queue) -> None:
    import signal

    # a terminal's Ctrl-C reaches every rank too: the parent alone stops the run (it kills the ranks)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(NVLS_OFF)
    try:
        device = layout.device(rank)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if device.type == "cuda":
            torch.distributed.init_process_group("nccl", init_method=init, rank=rank, world_size=world)
            try:
                out = fn(Group(rank, world, device, Path(folder)), *args)
            finally:
                torch.distributed.destroy_process_group()
        else:
            store = torch.distributed.FileStore(str(Path(folder) / "store"), world)
            store.set_timeout(timedelta(seconds=STORE_WAIT_S))
            out = fn(Group(rank, world, device, Path(folder), store), *args)
        # as bytes: a tensor put on a queue as itself is shared by a file descriptor that dies with this process
        buf = io.BytesIO()
        torch.save(out, buf)
        message = (rank, True, buf.getvalue())
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller, named by rank
        message = (rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    queue.put(message)  # once: a result, or why there is none


def run_ranks(layout: RankLayout, fn: Callable, *args, timeout_s: float = 600.0) -> list:
    """fn(group, *args) on every rank of `layout`, each in its own process; the results in rank order. A rank
    that raises fails the run, named (`RankFailed`); one still running at the timeout is killed with the rest.
    fn and its arguments must be picklable (a module-level function)."""
    results, failed = _run_ranks(layout, fn, args, timeout_s, wait_all=False)
    world = layout.gpus
    if failed:
        r = min(failed)
        raise RankFailed(f"rank {r} of {world} failed: {failed[r].strip().splitlines()[0]}", hint=failed[r][-2000:])
    missing = [r for r in range(world) if r not in results]
    if missing:
        raise RankFailed(f"ranks {missing} of {world} did not finish in {timeout_s:.0f} s (killed)")
    return [results[r] for r in range(world)]


def run_ranks_through(layout: RankLayout, fn: Callable, *args, timeout_s: float = 600.0) -> tuple[dict, dict]:
    """As run_ranks, but a rank that fails or dies does not end the run: every other rank runs on until it
    finishes or the timeout (then it is killed). Returns (results by rank, why by rank for those that failed or
    did not finish); nothing is left running."""
    results, failed = _run_ranks(layout, fn, args, timeout_s, wait_all=True)
    for r in range(layout.gpus):
        if r not in results and r not in failed:
            failed[r] = f"did not finish in {timeout_s:.0f} s (killed)"
    return results, failed


def _run_ranks(layout: RankLayout, fn: Callable, args: tuple, timeout_s: float, wait_all: bool) -> tuple[dict, dict]:
    """The ranks' processes, their results and failures by rank. `wait_all`: a failure does not end the wait."""
    import multiprocessing as mp
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    world = layout.gpus
    with tempfile.TemporaryDirectory(prefix="glm53ctl-ranks-") as folder:
        init = f"file://{Path(folder) / 'rendezvous'}"
        env = {k: os.environ.get(k) for k in NVLS_OFF}
        os.environ.update(NVLS_OFF)  # a spawned child reads its environment at start: set it here too
        procs = [
            ctx.Process(target=_child, args=(r, world, layout, folder, init, fn, args, queue), daemon=True)
            for r in range(world)
        ]
        try:
            for p in procs:
                p.start()
            results, failed = {}, {}
            import time

            deadline = time.monotonic() + timeout_s
            # the first failure ends the wait (unless `wait_all`): the other ranks may be stuck on the failed one
            # (they are killed)
            while len(results) + (len(failed) if wait_all else 0) < world and (wait_all or not failed):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    rank, ok, out = queue.get(timeout=min(left, 1.0))
                except queue_mod.Empty:
                    if any(p.exitcode not in (None, 0) for p in procs) and queue.empty():
                        for r, p in enumerate(procs):
                            if p.exitcode not in (None, 0) and r not in results and r not in failed:
                                failed[r] = f"exited with code {p.exitcode}"
                    continue
                if ok:
                    results[rank] = torch.load(io.BytesIO(out), weights_only=False)
                else:
                    failed[rank] = out
        finally:
            for p in procs:
                if p.pid is None:  # never started (its start raised): nothing to stop
                    continue
                if p.is_alive():
                    p.kill()
                p.join(timeout=10)
            queue.close()
            for k, v in env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return results, failed


@dataclass
class PeerLinks:
    """What a launch on real ranks is given: its rank, and its mailboxes: `slots` [2, T, R, N] fp32 (every
    rank's share of an all-reduce or all-gather, pushed by its owner, in two halves by launch parity) and `flags`
    (the table's flag words, then one word per peer, written by that peer)."""

    rank: int
    slots: Mailbox
    flags: Mailbox

    @classmethod
    def open(cls, group: Group, kind: str, shapes: dict[str, tuple[int, ...]]) -> PeerLinks:
        """This rank's two mailboxes of a launch of `kind`, at the shapes its launch class says
        (`mailbox_shapes`), made and mapped by every rank together."""
        slots = Mailbox(group, f"{kind}.slots", shapes["slots"], torch.float32)
        return cls(group.rank, slots, Mailbox(group, f"{kind}.flags", shapes["flags"], torch.int32))


class Mailbox:
    """This rank's buffer that every peer writes into (`shape`, `dtype`), and this process's view of every
    rank's (`views[q]`; `views[rank]` is `local`), with their addresses as a tensor on the device (`bases`): what
    a launch pushes through. `name` tells one mailbox of a rank from another."""

    def __init__(self, group: Group, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.group, self.name, self.shape, self.dtype = group, name, shape, dtype
        n = 1
        for s in shape:
            n *= s
        if group.device.type == "cpu":
            path = lambda q: group.folder / f"{name}.rank{q}"  # noqa: E731
            # each rank makes its own file, zeroed, before anyone maps it
            mine = torch.from_file(str(path(group.rank)), shared=True, size=n, dtype=dtype)
            mine.zero_()
            group.barrier()
            self.views = [
                mine if q == group.rank else torch.from_file(str(path(q)), shared=True, size=n, dtype=dtype)
                for q in range(group.world)
            ]
            self.views = [v.view(shape) for v in self.views]
        else:  # torch symmetric memory: every rank's buffer mapped into this one's address space (not yet run)
            from torch.distributed import _symmetric_memory as symm_mem

            mine = symm_mem.empty(n, dtype=dtype, device=group.device)
            mine.zero_()
            handle = symm_mem.rendezvous(mine, torch.distributed.group.WORLD.group_name)
            self.views = [handle.get_buffer(q, (n,), dtype).view(shape) for q in range(group.world)]
            group.barrier()
        self.local = self.views[group.rank]
        self.bases = torch.tensor([v.data_ptr() for v in self.views], dtype=torch.int64, device=group.device)


@dataclass(frozen=True)
class WeightsSource:
    """Where a rank takes its weights from (picklable, so every rank makes its own): `path`, a file or checkpoint
    folder (`run --weights`: each rank reads only its slice), else random ones of `seed` drawn on `draw` (None:
    the rank's own device type, as `check`'s emulation draws them; "cpu": as `run` draws them)."""

    seed: int = 0
    draw: str | None = None
    path: str | None = None

    def load(self, spec, device: torch.device):

        if self.path is not None:
            return load_weights(Path(self.path), spec, partial=True)
        return Weights(spec, seed=self.seed, device=self.draw or device.type)


class RankPart(NamedTuple):
    """One kind's launch on this rank, as a step made of several kinds chains them (`model` on real ranks):
    `run(x, mute, budget_ns)` launches once and returns its outputs on the CPU; `reset()` forgets the state a
    chained part carries from launch to launch (its next launch reads its input's); `timed(x)` (bench): the
    launch on x's tensors moved to the device once, as (call, out): call() launches once, unchecked and with
    nothing copied back (what `bench --gpus` times), out is the buffer of its main output (H, the logits) that
    the next part of a step reads."""

    launch: object
    run: Callable
    reset: Callable = lambda: None
    timed: Callable | None = None


def compile_on_rank(group: Group, launch) -> None:
    """On a GPU, compile a rank's launch (a list: a step's; a stage schedule: each stage's) before the ranks
    meet: ranks that compile seconds apart would fault their first launch on a peer's wait."""

    if group.device.type != "cuda":
        return
    for whole in launch if isinstance(launch, list) else [launch]:
        for la in getattr(whole, "stages", [whole]):
            args = on_device(la.placeholder_args(), group.device)
            la.kernel.warmup(**args, **la.constexprs(), **la.options(), grid=(la.grid,))


def launches_on_rank(group: Group, launch, run: Callable, inputs: list, mute: list, budget_ns) -> list:
    """What every kind's rank function ends with: its launch (a list: a step's launches) compiled (on a GPU)
    before the ranks first meet, then per input a barrier (the ranks start far apart, and after a fault none may
    drift a launch ahead: it would push into the half of a peer's mailbox the peer still reads) and
    `run(x, mute, budget_ns)`, which
    launches once and returns the outputs (on the CPU); a LaunchFault comes back in words. `mute[i]`: the rank
    that never publishes at launch i (-1: none), or (rank, "killed"): that rank's process is killed (SIGKILL)
    `KILL_AFTER_S` into the launch, before it publishes; only those launches wait `budget_ns` (the others, the
    default)."""

    compile_on_rank(group, launch)
    out = []
    for i, x in enumerate(inputs):
        group.barrier()
        who = mute[i] if mute else -1
        killed = isinstance(who, tuple | list)  # (rank, "killed"): that rank dies during the launch, unpublished
        q = who[0] if killed else who
        silent = q == group.rank
        if killed and silent:
            threading.Timer(KILL_AFTER_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
        try:
            out.append(run(x, silent, budget_ns if q >= 0 else None))
        except LaunchFault as e:
            out.append(str(e))
        if killed and silent:  # a launch shorter than KILL_AFTER_S: dead at its end, before a word of it goes out
            os.kill(os.getpid(), signal.SIGKILL)
    return out


def given_to_ranks(x):
    """An input as the ranks' processes are given it: a tensor as nested lists, a layer's input on the CPU."""
    return x.tolist() if isinstance(x, torch.Tensor) else x.to("cpu")


def steps_on_ranks(fn: Callable, key, xs: list, source, chain: bool = True) -> list[list[dict]]:
    """Per rank, per input of `xs`, what the kind's rank function `fn` returned (`chain`: each launch after the first
    reading the state its rank's launch before wrote: a run's steps). A fault fails the run, named."""
    layout = RankLayout(key.tp, key.tp, torch.device(key.device).type)
    chained = (True,) if chain else ()  # the layer kinds' rank functions take it; the stateless ones have none
    out = run_ranks(layout, fn, key, [given_to_ranks(x) for x in xs], [], None, source, *chained)
    for r, per_step in enumerate(out):
        for i, got in enumerate(per_step):
            if not isinstance(got, dict):
                raise CheckFailed(f"rank {r} of {key.tp}, step {i + 1}: {got}")
    return out
