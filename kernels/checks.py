"""What `glm53ctl check` and `glm53ctl fault` prove, per build key (docs/design.md §7).

check: accuracy of every output against the reference (relative RMS under a bound per tensor, NaN never
passes, outputs poisoned before the launch, fresh seeded inputs per key); determinism (bitwise equal across
grid sizes and repeated launches with no host reset); invariants (every output element written, states
finite, and for the kinds that have them: selected indices valid, routing distinct and summing to scale).
fault: each guarded wait stuck in turn is named by LaunchFault within its budget, nothing hangs, and the
retried launch equals a clean one bit for bit.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass, field

import torch

from glm53ctl.errors import UsageError
from glm53ctl.interrupts import whole_line
from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds import load_harness, load_ranks
from glm53ctl.kernels.numerics import bits, rel_rms
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.ranks import RankFailed, RankLayout, given_to_ranks, run_ranks, run_ranks_through
from glm53ctl.kernels.weights import Weights


def key_seed(seed: int, key: str) -> int:
    """Fresh inputs per key, the same for a given seed on every machine."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{key}".encode()).digest()[:4], "little")


def key_name(model: str, kind: str, tp: int, rows: int, context: int | None = None) -> str:
    """A key's name; a context given (kinds that read caches) is part of it: `glm53_flash/sparse/tp4/r1/ctx32768`."""
    return f"{model}/{kind}/tp{tp}/r{rows}" + (f"/ctx{context}" if context is not None else "")


@dataclass
class CheckResult:
    key: str
    errors: dict[str, float] = field(default_factory=dict)
    bounds: dict[str, float] = field(default_factory=dict)
    grids_equal: bool = True
    repeats_equal: bool = True
    schedules_equal: bool = True  # the key in its other schedule (knob `launch`) gives the same bits
    invariants: dict[str, bool] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def other_schedule(key: ResolvedKey) -> str | None:
    """The schedule (knob `launch`) `check` proves a key's bits in besides its own: stages for a persistent
    launch, persistent for stages (a step: stages, handed to every part, unless that is its own); None for a
    kind without the knob."""
    launch = key.knobs.get("launch")
    if launch is None:
        return None
    return "persistent" if launch == "stages" else "stages"


def outputs_equal(a: dict, b: dict) -> bool:
    """The same names, and every tensor bitwise equal (a NaN equals a NaN of the same bits: a launch that writes
    NaN the same way on every grid is not said to differ across grids; its NaN is the accuracy check's)."""
    return a.keys() == b.keys() and all(
        a[n].shape == b[n].shape and a[n].dtype == b[n].dtype and torch.equal(bits(a[n]), bits(b[n])) for n in a
    )


def make_harness(weights: Weights, key: ResolvedKey, **extra):
    """The launch harness of one resolved key (the kind registry's harness class); `extra`, what a kind's harness
    takes of its own (a step's `timing`)."""
    return load_harness(key.kind)(weights, key, **extra)


def build_launches(spec, key: ResolvedKey) -> list[tuple[str, object]]:
    """A key's launches, built on the CPU without weights (what `build` compiles and a tune tells apart)."""
    return load_harness(key.kind).build_launches(spec, key)


def launch_outputs(weights: Weights, key: ResolvedKey, seed: int) -> dict[str, torch.Tensor]:
    """The kernel's outputs and writes for a key's seeded inputs (what `check --against` compares bit for bit)."""
    k = make_harness(weights, key)
    x = k.inputs(key_seed(seed, key.name))[0]
    return {n: t.cpu() for n, t in k(x, poison=True).items()} | k.writes()


def _quiet(at: str) -> None:
    pass


def check_key(weights: Weights, key: ResolvedKey, seed: int, tick=_quiet) -> tuple[CheckResult, dict]:
    """`tick(where)`: told where the check is (a heartbeat prints it during a long key)."""
    tick("making the launch")
    k = make_harness(weights, key)
    bounds = dict(k.bounds)
    res = CheckResult(key.name, bounds=bounds)
    x = k.inputs(key_seed(seed, res.key))[0].to(k.device)
    peers = k.peer_partials(x)
    tick("the first launch")
    out = k(x, peers, poison=True)
    k.follow = {n: out[n] for n in k.FOLLOWED if n in out}  # near-ties in a top-k go the launch's way
    tick("the reference")
    ref = k.reference(x)
    for name, bound in bounds.items():
        res.errors[name] = err = rel_rms(ref[name], out[name])
        if bool(out[name].isnan().any()):
            res.problems.append(f"{name}: NaN in the output (relative RMS error inf, its bound {bound:g})")
        elif not err <= bound:
            res.problems.append(f"{name}: relative RMS error {err:.3g} over its bound {bound:g}")
    for name, holds in k.invariants(out, ref).items():
        res.invariants[name] = holds
        if not holds:
            res.problems.append(f"invariant broken: {name}")
    # NaN poison in a float output, -1 in an integer one (the routed ids)
    # (a kind whose integer output may hold -1, the selection's padding, poisons it with its own value)
    poison_int = k.POISON_INT
    poisoned = lambda n: next((v for end, v in poison_int.items() if n.endswith(end)), -1)  # noqa: E731
    unwritten = [n for n, t in out.items() if (t.isnan().any() if t.is_floating_point() else (t == poisoned(n)).any())]
    res.invariants["every output element written"] = not unwritten
    if unwritten:
        res.problems.append(f"an output element was not written (its poison left): {', '.join(unwritten)}")
    # a kind of many launches (`model`) checks fewer: its parts' grids and repeats are their own kinds' checks
    for g in k.CHECK_GRIDS:
        tick(f"the launch at grid {g}")
        other = make_harness(weights, key.with_knobs({"grid": g}))(x, peers, poison=True)
        if not outputs_equal(out, other):
            res.grids_equal = False
            res.problems.append(f"grid {g} gives other bits than grid {k.knobs.grid}")
    if (other := other_schedule(key)) is not None:
        tick(f"the launch as launch={other}")
        if not outputs_equal(out, make_harness(weights, key.with_knobs({"launch": other}))(x, peers, poison=True)):
            res.schedules_equal = False
            res.problems.append(f"launch={other} gives other bits than launch={key.knobs.launch}")
    epoch = k.launch.runtime.epoch
    for i in range(k.CHECK_REPEATS):
        tick(f"repeated launch {i + 1} of {k.CHECK_REPEATS}")
        if not outputs_equal(out, k(x, peers, poison=True)):
            res.repeats_equal = False
            res.problems.append(f"launch {i + 2} in a row gives other bits")
    res.invariants["tag advanced once per launch"] = k.launch.runtime.epoch == epoch + k.CHECK_REPEATS
    if not res.invariants["tag advanced once per launch"]:
        res.problems.append("the launch tag did not advance once per launch")
    return res, {n: t.cpu() for n, t in out.items()}


@dataclass
class FaultResult:
    key: str
    sites: int = 0
    named: int = 0
    hangs: int = 0
    retries_equal: int = 0
    worst_s: float = 0.0  # the slowest stuck launch: its budget per wait, plus the launch
    sites_total: int = 0  # the sites this run sticks (a hang ends the key before the later ones)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.named == self.sites == self.retries_equal and self.hangs == 0


def fault_key(
    weights: Weights, key: ResolvedKey, site: int | None, budget_ns: int, wall_s: float, tick=_quiet
) -> FaultResult:
    """Each site (or one) stuck in turn. A launch that outlives `wall_s` is reported as a hang and the
    process ends (a hung GPU launch cannot be recovered from inside it). `tick(where)`: the sites done so far."""
    res = FaultResult(key.name)
    tick("the clean launch")
    k = make_harness(weights, key, **load_harness(key.kind).FAULT_OPTIONS)
    x = k.inputs(key_seed(0, res.key))[0].to(k.device)
    peers = k.peer_partials(x)
    clean = k(x, peers, poison=True)
    n_sites = len(k.launch.table.sites)
    sites = range(n_sites) if site is None else [site]
    res.sites_total = n_sites if site is None else site + 1
    if site is not None and not 0 <= site < n_sites:
        raise UsageError(f"--site {site}: {res.key} has sites 0..{n_sites - 1}")
    for s in sites:
        tick(f"{res.sites} of {len(sites)} site{'s' if len(sites) != 1 else ''} stuck")
        res.sites += 1
        # the stuck launch and its retry each within the wall bound, or the watchdog reports a hang
        watchdog = threading.Timer(wall_s, _hang, args=(res, s, wall_s))
        watchdog.start()
        try:
            t0 = time.perf_counter()
            try:
                k(x, peers, stuck_site=s, budget_ns=budget_ns)
                res.problems.append(f"site {s}: no LaunchFault")
            except LaunchFault as e:
                if e.site == s:
                    res.named += 1
                else:
                    res.problems.append(f"site {s}: LaunchFault named site {e.site}")
            res.worst_s = max(res.worst_s, time.perf_counter() - t0)
            # poisoned: a retry that writes nothing cannot pass on the bits an earlier launch left behind
            epoch = k.launch.runtime.epoch
            if not outputs_equal(clean, k(x, peers, poison=True)):
                res.problems.append(f"site {s}: the retried launch differs from a clean one")
            elif k.launch.runtime.epoch != epoch + 1:
                res.problems.append(f"site {s}: the retried launch did not advance the launch tag once")
            else:
                res.retries_equal += 1
        finally:
            watchdog.cancel()
    return res


# where a hung key's result goes before its process ends (`fault` runs keys in worker processes and reads it)
HANG_LOG_ENV = "GLM53CTL_HANG_LOG"


def _hang(res: FaultResult, site: int, wall_s: float) -> None:
    """The watchdog: the stuck launch has not returned within `wall_s`. A hung launch cannot be recovered from
    inside its process, so the key's result, the hang counted, goes to $GLM53CTL_HANG_LOG (a line of JSON) and
    the process ends; the command that started it reaps it and reports the hang."""
    import json

    try:  # whatever goes wrong in saying it, the process ends: a watchdog that raised would leave the hang
        res.hangs += 1
        res.worst_s = max(res.worst_s, wall_s)
        left = range(site + 1, res.sites_total)
        later = ""
        if len(left) == 1:
            later = f"; site {left[0]} not tried"
        elif left:
            later = f"; sites {left[0]}..{left[-1]} not tried"
        res.problems.append(f"site {site}: the launch did not return within {wall_s:g} s (a hang){later}")
        # stderr: under --json stdout carries the document alone
        whole_line(f"Error: {res.key}: site {site} stuck: the launch did not return within {wall_s:g} s (a hang)")
        if log := os.environ.get(HANG_LOG_ENV):
            with open(log, "a") as f:
                f.write(json.dumps(fault_row(res)) + "\n")
    finally:
        os._exit(1)


def fault_row(res: FaultResult) -> dict:
    """A key's fault result as a plain dict (what a worker process sends back, or leaves in the hang log)."""
    return {
        "key": res.key,
        "sites": res.sites,
        "named": res.named,
        "hangs": res.hangs,
        "retries_equal": res.retries_equal,
        "worst_s": round(res.worst_s, 4),
        "ok": res.ok,
        "problems": res.problems,
    }


__all__ = [
    "CheckResult",
    "FaultResult",
    "build_launches",
    "check_key",
    "fault_key",
    "fault_row",
    "launch_outputs",
    "make_harness",
]


# real ranks (kernels/runtime/ranks.py): `check --gpus T` and `fault --gpus T`

# what a rank's process takes before its first launch (torch and Triton imported, weights drawn): not a hang
STARTUP_S = 180.0


def _on_ranks(weights: Weights, key: ResolvedKey, seed: int, launches: int):
    """The emulation's outputs (the key's one-device harness) for its seeded inputs of `launches` launches, and
    what the ranks are given of those inputs."""
    k = make_harness(weights, key)
    xs = k.inputs(key_seed(seed, key.name), steps=launches)
    want = [{n: t.cpu() for n, t in k(x).items()} for x in xs]
    return want, [given_to_ranks(x) for x in xs]


def _rank_view(fn, want: dict, rank: int, tp: int) -> dict:
    """What rank `rank` should return of the emulation's outputs: all of them, or (a kind whose ranks write
    slices of a state, `fn.rank_view`) its slices of those writes."""
    view = getattr(fn, "rank_view", None)
    return view(want, rank, tp) if view else want


def ranks_key(weights: Weights, key: ResolvedKey, seed: int, launches: int | None = None) -> dict:
    """The key on T real ranks, one process each (a GPU each, or on a CPU a process each under the interpreter),
    `launches` launches in a row (default: the harness's RANK_LAUNCHES, 3; a step's 1, itself two steps) from
    the key's seeded inputs: every rank's every output bitwise equal to the one-device emulation's
    (`check --gpus T`)."""

    launches = launches or load_harness(key.kind).RANK_LAUNCHES
    tp = key.tp
    layout = RankLayout(tp, tp, torch.device(key.device).type)
    want, given = _on_ranks(weights, key, seed, launches)
    fn = load_ranks(key.kind)
    out = run_ranks(layout, fn, key, given, [], None)
    problems = []
    for r, per_launch in enumerate(out):
        for i, got in enumerate(per_launch):
            mine = _rank_view(fn, want[i], r, tp)
            if not isinstance(got, dict):
                problems.append(f"rank {r} launch {i}: {got}")
            elif not outputs_equal(got, mine):
                names = [n for n in mine if n not in got or not torch.equal(got[n], mine[n])]
                problems.append(f"rank {r} launch {i}: {', '.join(names)} differ from the emulation")
    n = tp * launches
    return {"key": key.name, "ranks": tp, "launches": n, "equal": n - len(problems), "problems": problems}


def run_on_ranks(weights: Weights, key: ResolvedKey, run_key, source) -> dict[str, torch.Tensor]:
    """`run --backend triton --gpus T`: the run's steps (its inputs from `weights`, as a one-device run makes
    them) on T real ranks, each rank's weights from `source` (a WeightsSource: the run's); the tensors to save:
    what a one-device run saves (its inputs, rank 0's outputs of the last step as `outputs.*`, a layer's state
    or caches after it as `writes.*`) and every rank's outputs as `ranks.<r>.*` (the harness's `run_ranks`). A
    rank whose launch faults fails the run, named."""
    return load_harness(key.kind).run_ranks(weights, run_key, key, source, load_ranks(key.kind))


def ranks_fault_key(weights: Weights, key: ResolvedKey, budget_ns: int, wall_s: float) -> dict:
    """Each rank in turn never publishes (its launch runs; its tag never goes out): every other rank's launch
    raises LaunchFault naming that peer, no rank hangs (`wall_s` for the whole run), and the next launch on every
    rank gives the emulation's bits (`fault --gpus T`)."""

    tp = key.tp
    layout = RankLayout(tp, tp, torch.device(key.device).type)
    want, given = _on_ranks(weights, key, 0, 1)
    fn = load_ranks(key.kind)
    named = hangs = clean = 0
    problems = []
    for q in range(tp):
        try:
            args = (key, given * 2, [q, -1], budget_ns)
            out = run_ranks(layout, fn, *args, timeout_s=STARTUP_S + 2 * wall_s)
        except RankFailed as e:
            hangs += "did not finish" in str(e)
            problems.append(f"peer {q} mute: {e}")
            continue
        said = [out[r][0] for r in range(tp) if r != q]
        if all(isinstance(s, str) and f"waited for peer rank {q} (" in s for s in said):
            named += 1
        else:
            problems.append(f"peer {q} mute: not named by every other rank: {said}")
        if all(
            isinstance(out[r][1], dict) and outputs_equal(out[r][1], _rank_view(fn, want[0], r, tp)) for r in range(tp)
        ):
            clean += 1
        else:
            problems.append(f"peer {q} mute: the next launch is not the emulation's on every rank")
    killed, reported = _killed_ranks(layout, fn, key, given, budget_ns, wall_s, problems)
    return {
        "key": key.name,
        "peers": tp,
        "named": named,
        "hangs": hangs,
        "retries_equal": clean,
        "killed": killed,
        "killed_reported": reported,
        "problems": problems,
    }


def _killed_ranks(layout, fn, key: ResolvedKey, given: list, budget_ns: int, wall_s: float, problems: list):
    """Each rank in turn killed (SIGKILL) during its launch, before it publishes: the run reports it dead, every
    other rank's guard names it as the peer it waited for, within the budget (no rank runs on to the timeout),
    and nothing is left running (run_ranks_through joins every process). Returns (killed, reported)."""

    tp, reported = key.tp, 0
    for q in range(tp):
        start = time.monotonic()
        results, failed = run_ranks_through(layout, fn, key, given[:1], [(q, "killed")], budget_ns,
                                            timeout_s=STARTUP_S + 2 * wall_s)  # fmt: skip
        said = [results.get(r, [None])[0] for r in range(tp) if r != q]
        dead = q in failed and "exited with code" in failed[q]
        others = [r for r in failed if r != q]
        if not dead:
            problems.append(f"rank {q} killed: not reported dead ({failed.get(q) or 'it finished'})")
        elif others:
            problems.append(f"rank {q} killed: rank {others[0]} did not finish either: {failed[others[0]]}")
        elif not all(isinstance(s, str) and f"waited for peer rank {q} (" in s for s in said):
            problems.append(f"rank {q} killed: not named by every other rank: {said}")
        else:
            reported += 1
        if (took := time.monotonic() - start) > STARTUP_S + wall_s:
            problems.append(f"rank {q} killed: its peers took {took:.0f} s to stop")
    return tp, reported
