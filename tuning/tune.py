"""`glm53ctl tune`: an Optuna study per key over the kind's knobs, and the keep rule (docs/design.md §8).

1. The search: the knob space of a key from the registry (or the part of it asked for); the default is the
   first trial; a sampler that suits the space (every point where the space is no larger than the trials, TPE
   otherwise). A trial whose launch is one already measured (the same code, table and grid: `identity`) takes
   that trial's value and is not timed again. Every trial is checked before it is timed: `schedule` knobs
   bitwise against the default's outputs and writes, `numeric` ones by the reference bounds; a trial that fails
   is pruned with why, and never chosen.
2. The decision: the best few distinct trials are measured against the default in alternating rounds (A B B A;
   δ from a same-against-same run first); from the fastest, each changed knob is dropped in turn: a knob stays
   only where the launch with it is faster than without it beyond δ (the upper bound of the ratio's interval
   below 1 - δ). What remains is measured against the default once more; it is kept only if faster beyond δ.

Studies persist in Optuna storage (tuning/storage.py: SQLite by default; a journal file or a database URL lets several
worker processes or hosts share one study) and resume: a study stops at `trials` finished trials, however many runs
and workers it took. The GPU side is an `Evaluator`; tests give one with a synthetic timer.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from glm53ctl.errors import CheckFailed, UsageError
from glm53ctl.kernels.checks import build_launches, key_seed, make_harness
from glm53ctl.kernels.key import resolve_grid
from glm53ctl.kernels.kinds import get_kind
from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.tuning import measure
from glm53ctl.tuning.bench import timer_for
from glm53ctl.tuning.knobs import Knob, defaults, kind_knobs, legacy_key
from glm53ctl.tuning.storage import DEFAULT_STORAGE as DEFAULT_STORAGE  # the storage's forms: tuning/storage.py
from glm53ctl.tuning.storage import storage_of as storage_of


class Evaluator(Protocol):
    """What a study needs of one key: see GpuEvaluator for the real one."""

    def identity(self, knobs: dict) -> str:
        """Equal for two knob sets exactly when they give the same launch (code, table, grid)."""

    def check(self, knobs: dict) -> str | None:
        """None if the knob set's launch is correct (bitwise or within bounds, as its knobs' classes ask), else
        why not."""

    def timer(self, knobs: dict) -> Callable[[], float]:
        """A timer of the knob set's launch: each call one sample, µs per launch."""

    def release(self, knobs: dict) -> None:
        """The knob set's launch is no longer needed (free its memory)."""


@dataclass
class KnobDecision:
    knob: str
    value: Any
    kept: bool
    reason: str
    ratio: float | None = None  # with / without the knob (below 1: the knob makes the launch faster)
    ratio_ci: tuple[float, float] | None = None


@dataclass
class TuneResult:
    study: str
    default: dict
    default_us: float | None
    best_trial: dict | None  # the search's fastest distinct trial: number, value, knobs
    candidates: list[dict] = field(default_factory=list)  # the best few against the default
    decisions: list[KnobDecision] = field(default_factory=list)
    kept: dict = field(default_factory=dict)  # the knobs kept (name -> value; others at their defaults)
    evidence: dict | None = None  # the kept set against the default: tuned.Evidence's fields
    delta: float | None = None
    trials: dict = field(default_factory=dict)  # finished trials by state: complete, pruned (rejected), same

    def to_json(self) -> dict:
        d = self.__dict__.copy()
        d["decisions"] = [x.__dict__ for x in self.decisions]
        return d


def space_of(knobs: dict[str, Knob], names: list[str] | None = None) -> dict[str, tuple]:
    """The knobs searched, name -> values: all of the kind's (grid as its listed program counts), or `names`."""
    if names:
        bad = [n for n in names if n not in knobs]
        if bad:
            raise UsageError(f"--space: {', '.join(bad)} not a knob here", hint=f"knobs: {', '.join(knobs)}")
        return {n: knobs[n].values for n in names}
    return {n: k.values for n, k in knobs.items()}


def study_name(
    model: str,
    kind: str,
    tp: int,
    rows: int,
    space: dict[str, tuple],
    code: str,
    context: int | None = None,
    base: dict | None = None,
) -> str:
    """One study per key (and context), search space, knobs held outside it (`base_of`) and code: trials timed on
    other code, over another space or beside other held knobs are another study's (a resumed study never mixes
    them)."""
    what = [space, code] + ([base] if base else [])  # without held knobs, the names of before
    digest = hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{model}-{kind}-tp{tp}-r{rows}" + (f"-ctx{context}" if context is not None else "") + f"-{digest}"


def _sampler(space: dict[str, tuple], trials: int, seed: int):
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    size = math.prod(len(v) for v in space.values())
    if size <= trials:
        return optuna.samplers.BruteForceSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(3, trials // 3)))


def search(
    ev: Evaluator,
    default: dict,
    space: dict[str, tuple],
    storage,
    name: str,
    trials: int,
    seed: int = 0,
    samples: int = 9,
    on_trial: Callable[[Any, Any], None] | None = None,
):
    """Run the study until it holds `trials` finished trials (complete or rejected), however many runs and
    workers share it; the default first. Returns the study."""
    import optuna
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = _sampler(space, trials, seed)
    # the worker that creates the study enqueues the default, once (a check for an empty study then an enqueue
    # would let two workers starting together both enqueue it); the others wait until it is there
    try:
        study = optuna.create_study(study_name=name, storage=storage, direction="minimize", sampler=sampler)
        study.enqueue_trial({n: default[n] for n in space}, user_attrs={"default": True})
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
        deadline = time.monotonic() + 30
        while not study.get_trials(deepcopy=False) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not study.get_trials(deepcopy=False):  # its creator died before enqueueing
            study.enqueue_trial({n: default[n] for n in space}, user_attrs={"default": True})
    states = (TrialState.COMPLETE, TrialState.PRUNED)

    def objective(trial) -> float:
        params = {n: trial.suggest_categorical(n, list(values)) for n, values in space.items()}
        knobs = default | params
        ident = ev.identity(knobs)
        trial.set_user_attr("identity", ident)
        for t in study.get_trials(deepcopy=False, states=states):
            if t.user_attrs.get("identity") == ident and t.number != trial.number:
                trial.set_user_attr("same_as", t.number)
                if t.state == TrialState.PRUNED:
                    why = t.user_attrs.get("rejected", "rejected")
                    trial.set_user_attr("rejected", why)
                    raise optuna.TrialPruned(why)
                return t.value
        why = ev.check(knobs)
        if why is not None:
            trial.set_user_attr("rejected", why)
            ev.release(knobs)
            raise optuna.TrialPruned(why)
        timer = ev.timer(knobs)
        us = statistics.median(timer() for _ in range(samples))
        ev.release(knobs)
        return us

    done = len(study.get_trials(deepcopy=False, states=states))
    if done < trials:
        stop = optuna.study.MaxTrialsCallback(trials, states=states)
        callbacks = [stop] + ([on_trial] if on_trial else [])
        study.optimize(objective, n_trials=trials - done, callbacks=callbacks, catch=())
    return study


def _finished(study):
    from optuna.trial import TrialState

    return [t for t in study.get_trials(deepcopy=False) if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]


def decide(
    ev: Evaluator,
    study,
    default: dict,
    space: dict[str, tuple],
    top: int = 3,
    rounds: int = 15,
    where: str = "",
) -> TuneResult:
    """The keep rule over a finished search (module docstring, step 2)."""
    from optuna.trial import TrialState

    finished = _finished(study)
    complete = sorted((t for t in finished if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    counts = {
        "complete": sum(1 for t in complete if "same_as" not in t.user_attrs),
        "rejected": sum(1 for t in finished if t.state == TrialState.PRUNED),
        "same_launch": sum(1 for t in complete if "same_as" in t.user_attrs),
    }
    knobs_of = lambda t: default | {n: t.params[n] for n in space if n in t.params}  # noqa: E731
    default_id = ev.identity(default)
    default_trials = [t for t in complete if t.user_attrs.get("identity") == default_id]
    result = TuneResult(study.study_name, default, None, None, trials=counts)
    if not default_trials:
        raise CheckFailed(f"{where}: the default's trial is not in the study's finished trials (it failed its check?)")
    result.default_us = default_trials[0].value
    seen, picks = {default_id}, []
    for t in complete:
        ident = t.user_attrs.get("identity")
        if ident in seen or t.value >= result.default_us:
            continue
        seen.add(ident)
        picks.append(t)
        if len(picks) == top:
            break
    if complete:
        best = complete[0]
        result.best_trial = {"number": best.number, "us": best.value, "knobs": _changed(knobs_of(best), default)}
    if not picks:
        result.decisions += _screened_out(complete, knobs_of, default, result.default_us, default, where)
        return result

    t_default = ev.timer(default)
    same = measure.ratio(*measure.ab_rounds(t_default, t_default, rounds))
    delta = result.delta = measure.keep_threshold(measure.spread(same))
    measured = []
    for t in picks:
        knobs = knobs_of(t)
        r = measure.ratio(*measure.ab_rounds(t_default, ev.timer(knobs), rounds))
        measured.append((r["ratio"], knobs, r))
        result.candidates.append({"trial": t.number, "knobs": _changed(knobs, default), **_brief(r)})
        ev.release(knobs)
    measured.sort(key=lambda m: m[0])
    chosen = measured[0][1]
    result.decisions += _screened_out(complete, knobs_of, default, result.default_us, chosen, where)

    # drop each changed knob in turn: it stays only where the launch with it beats the launch without it
    for name in [n for n in space if chosen[n] != default[n]]:
        without = chosen | {name: default[name]}
        value = chosen[name]
        if ev.identity(without) == ev.identity(chosen):
            result.decisions.append(KnobDecision(name, value, False, f"{name}={value}: the same launch {where}"))
            chosen = without
            continue
        why = ev.check(without)
        if why is not None:
            reason = f"{name}={value}: kept, the other knobs need it (without it: {why})"
            result.decisions.append(KnobDecision(name, value, True, reason))
            continue
        r = measure.ratio(*measure.ab_rounds(ev.timer(without), ev.timer(chosen), rounds))
        v = measure.verdict(r["ratio_ci"], delta)
        kept = v == "faster"
        reason = f"{name}={value}: {_pct(r['ratio'])} {where}, " + (
            "kept" if kept else ("dropped" if v == "slower" else f"within the noise (δ {100 * delta:.1f}%), dropped")
        )
        result.decisions.append(KnobDecision(name, value, kept, reason, r["ratio"], r["ratio_ci"]))
        ev.release(without)
        if not kept:
            ev.release(chosen)
            chosen = without
    if chosen != default:
        r = measure.ratio(*measure.ab_rounds(t_default, ev.timer(chosen), rounds))
        if measure.verdict(r["ratio_ci"], delta) == "faster":
            result.kept = _changed(chosen, default)
            result.evidence = {
                "default_us": r["a_us"],
                "chosen_us": r["b_us"],
                "ratio": r["ratio"],
                "ratio_ci": r["ratio_ci"],
                "delta": delta,
                "samples": r["samples"],
            }
        else:
            for d in result.decisions:
                if d.kept:
                    d.kept = False
                    d.reason += f"; together {_pct(r['ratio'])} against the default, not beyond δ: dropped"
    return result


def _screened_out(complete, knobs_of, default: dict, default_us: float, chosen: dict, where: str) -> list[KnobDecision]:
    """Each knob value that the search timed alone (every other knob at its default) and that the chosen trial
    does not carry (the drop test below decides those): dropped, with the search's medians."""
    picked = set(_changed(chosen, default).items())
    out = []
    for t in complete:
        changed = _changed(knobs_of(t), default)
        if len(changed) != 1 or "same_as" in t.user_attrs:
            continue
        ((name, value),) = changed.items()
        if (name, value) in picked:
            continue
        ratio = t.value / default_us
        reason = (
            f"{name}={value}: {_pct(ratio)} {where} in the search ({t.value:.1f} against the default's "
            f"{default_us:.1f} µs, trial {t.number}), dropped"
            + ("" if ratio >= 1 else ": the fastest set re-measured against the default is without it")
        )
        out.append(KnobDecision(name, value, False, reason, ratio))
    return sorted(out, key=lambda d: (d.knob, str(d.value)))


def _changed(knobs: dict, default: dict) -> dict:
    return {n: v for n, v in knobs.items() if default.get(n) != v}


def _brief(r: dict) -> dict:
    return {"default_us": r["a_us"], "us": r["b_us"], "ratio": r["ratio"], "ratio_ci": r["ratio_ci"]}


def _pct(ratio: float) -> str:
    """A ratio (with / without) in words: "1.8% slower", "3.0% faster"."""
    return f"{abs(ratio - 1) * 100:.1f}% {'slower' if ratio > 1 else 'faster'}"


class GpuEvaluator:
    """One key's launches on the GPU: harnesses per knob set (kept while in use), the default's outputs and the
    reference's, computed once on one seeded input."""

    def __init__(
        self, weights, key, *legacy, seed: int = 0, device: str = "cuda", context=None, base: dict | None = None
    ) -> None:
        """One resolved key's evaluator (`GpuEvaluator(weights, key, seed=...)`); or, as before resolved keys,
        `(weights, kind, tp, rows[, seed], device=..., context=...)` (knobs.legacy_key). `base`: knobs held at
        other values than the registry's defaults while the search runs (a search of part of the space keeps the
        key's tuned knobs outside it, `base_of`); the search's "default" is the defaults with them."""

        if isinstance(key, str):
            tp, rows, *rest = legacy
            seed = rest[0] if rest else seed
            key = legacy_key(weights.spec.name, key, tp, rows, None, device, context)
        self.key, self.weights, self.kind, self.tp, self.rows = key, weights, key.kind, key.tp, key.rows
        self.device, self.context = key.device, key.context
        self.entry = get_kind(self.kind)
        self.knobs = kind_knobs(self.kind)
        self.default = defaults(self.kind) | (base or {})
        self.harnesses: dict[str, Any] = {}
        self.default_identity = self.identity(self.default)
        k = self._harness(self.default)
        self.x = k.inputs(key_seed(seed, key.name))[0].to(k.device)
        self.default_out = self._outputs(k)
        k.follow = {n: self.default_out[n] for n in k.FOLLOWED if n in self.default_out}  # as `check`
        self.ref = k.reference(self.x)
        self.bounds = dict(self.entry.bounds)

    def _harness(self, knobs: dict):
        ident = self.identity(knobs)
        if ident not in self.harnesses:
            self.harnesses[ident] = make_harness(self.weights, self.key.with_knobs(knobs))
        return self.harnesses[ident]

    def _outputs(self, k) -> dict:
        return {n: t.clone() for n, t in k(self.x, poison=True).items()} | k.writes()

    def identity(self, knobs: dict) -> str:

        launches = build_launches(self.weights.spec, self.key.with_knobs(knobs))
        return launch_identity([la for _, la in launches])

    def check(self, knobs: dict) -> str | None:
        import torch

        try:
            out = self._outputs(self._harness(knobs))
        except Exception as e:  # a launch that fails to build or run is a rejected trial, with why
            return f"{type(e).__name__}: {e}"[:300]
        numeric = [n for n, v in knobs.items() if self.knobs[n].cls == "numeric" and v != self.default[n]]
        if not numeric:
            diff = [n for n in self.default_out if not torch.equal(self.default_out[n], out[n])]
            return f"not bitwise equal to the default: {', '.join(diff)}" if diff else None
        worse = []
        for n, bound in self.bounds.items():
            e = rel_rms(self.ref[n], out[n])
            if not e <= bound:  # NaN fails
                worse.append(f"{n} {e:.2e} > {bound:.0e}")
        return f"outside the bounds ({', '.join(numeric)} changed): {'; '.join(worse)}" if worse else None

    def timer(self, knobs: dict) -> Callable[[], float]:

        k = self._harness(knobs)
        peers = k.peer_partials(self.x)
        k(self.x, peers)
        return timer_for(k.timed(self.x, peers))[0]

    def release(self, knobs: dict) -> None:
        import torch

        ident = self.identity(knobs)
        if ident != self.default_identity:
            self.harnesses.pop(ident, None)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def base_of(key, space) -> dict:
    """The knobs of a resolved key that a search of `space` holds where the tuned file put them: those outside the
    space that differ from the registry's defaults (a search of `launch` alone keeps a tuned `block_n_down`, so
    what it measures is what the key will run, and `--write` keeps that knob)."""

    default = resolve_grid(defaults(key.kind), key.device)
    return {n: v for n, v in key.knobs.items() if n not in space and n in default and v != default[n]}


def launch_identity(launches) -> str:
    """A digest of what makes launches time differently: each one's kernel, compile-time constants, compile
    options, grid and task table. Two knob sets with equal digests run the same launch."""
    h = hashlib.sha256()
    for la in launches:
        fn = getattr(la.kernel, "fn", la.kernel)
        h.update(f"{fn.__module__}.{fn.__qualname__}".encode())
        h.update(json.dumps([la.constexprs(), la.options(), la.grid], sort_keys=True, default=str).encode())
        arrays = la.table.build("cpu")
        for name in sorted(arrays):
            h.update(name.encode())
            h.update(arrays[name].numpy().tobytes())
    return h.hexdigest()[:16]
