"""Every branch of tune's keep rule (tuning/tune.py) made to happen: by a synthetic timer (tests/tuning/synthetic.py)
that makes it so, and by checks that fail, the real ones included: nothing unproven reaches a tuned file."""

import optuna
import pytest

from glm53ctl import tuned
from glm53ctl.tuning import measure
from glm53ctl.tuning.tune import GpuEvaluator, decide, search, storage_of
from tests.tuning.synthetic import SyntheticEvaluator

PRUNED, COMPLETE = optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.COMPLETE


def _storage(tmp_path):
    return storage_of(f"sqlite:///{tmp_path / 'studies.db'}")


def _add(study, space: dict, params: dict, value: float, ident: str) -> None:
    """A finished trial as a search would have left it (what a noisy screening said)."""
    dists = {n: optuna.distributions.CategoricalDistribution(list(v)) for n, v in space.items()}
    study.add_trial(
        optuna.trial.create_trial(params=params, distributions=dists, value=value, user_attrs={"identity": ident})
    )


def _decided(ev, space: dict, default: dict, trials: list[tuple[dict, float]], tmp_path, where="at TP4"):
    study = optuna.create_study(study_name="s", storage=_storage(tmp_path))
    for params, value in trials:
        _add(study, space, params, value, ev.identity(default | params))
    return decide(ev, study, default, space, rounds=15, where=where)


def test_a_trial_that_reuses_a_rejected_launch_is_rejected_untimed(tmp_path):
    """`alias` changes no launch (its identity ignores it): the trial with bad=1, alias=1 is the rejected launch of
    bad=1, alias=0; it is rejected with the same reason, neither checked nor timed again, and never chosen, though
    the timer would make it the fastest."""
    space = {"bad": (0, 1), "alias": (0, 1)}
    default = {"bad": 0, "alias": 0}
    reject = lambda k: "not bitwise equal to the default: y" if k["bad"] else None  # noqa: E731
    canonical = lambda k: {"bad": k["bad"]}  # noqa: E731
    ev = SyntheticEvaluator(lambda k: 50.0 if k["bad"] else 100.0, reject=reject, canonical=canonical, seed=1)
    study = search(ev, default, space, _storage(tmp_path), "s", trials=4)
    bad = [t for t in study.get_trials() if t.params["bad"] == 1]
    assert [t.state for t in bad] == [PRUNED, PRUNED]
    assert [t.user_attrs["rejected"] for t in bad] == ["not bitwise equal to the default: y"] * 2
    assert bad[1].user_attrs["same_as"] == bad[0].number
    assert [k["bad"] for k in ev.checked].count(1) == 1 and not any(k["bad"] for k in ev.timed)
    # the alias of the default: the same launch, its value taken, not timed
    same = [t for t in study.get_trials() if t.params == {"bad": 0, "alias": 1}]
    assert same[0].state == COMPLETE and "same_as" in same[0].user_attrs
    res = decide(ev, study, default, space, rounds=15)
    assert res.kept == {} and res.trials == {"complete": 1, "rejected": 2, "same_launch": 1}


def test_no_trial_faster_than_the_default_keeps_nothing_and_times_nothing_more(tmp_path):
    """Every knob slower in the search: no candidate is re-measured (no A B B A rounds, no δ), each knob timed
    alone is dropped with its search figures, and nothing is kept."""
    space = {"a": (0, 1), "b": (0, 1)}
    ev = SyntheticEvaluator(
        lambda k: 100.0 * (1.05 if k["a"] else 1) * (1.02 if k["b"] else 1), seed=2, noise=0, drift=0
    )
    study = search(ev, {"a": 0, "b": 0}, space, _storage(tmp_path), "s", trials=4)
    timed = len(ev.timed)
    res = decide(ev, study, {"a": 0, "b": 0}, space, rounds=15, where="at TP2")
    assert len(ev.timed) == timed and res.delta is None and res.candidates == []
    assert res.kept == {} and res.evidence is None
    reasons = {d.knob: d.reason for d in res.decisions}
    assert reasons["a"].startswith("a=1: 5.0% slower at TP2 in the search (105.0 against the default's 100.0 µs")
    assert reasons["b"].startswith("b=1: 2.0% slower at TP2 in the search")
    assert all(not d.kept for d in res.decisions)


def test_a_knob_that_gives_the_same_launch_is_dropped_as_such(tmp_path):
    """The fastest set carries `alias`, which changes no launch: it is dropped as the same launch, untimed, and
    the knob that is faster stays."""
    space = {"fast": (0, 1), "alias": (0, 1)}
    default = {"fast": 0, "alias": 0}
    ev = SyntheticEvaluator(lambda k: 97.0 if k["fast"] else 100.0, canonical=lambda k: {"fast": k["fast"]}, seed=3)
    res = _decided(ev, space, default, [(default, 100.0), ({"fast": 1, "alias": 1}, 96.0)], tmp_path)
    assert res.best_trial == {"number": 1, "us": 96.0, "knobs": {"fast": 1, "alias": 1}}  # the search's fastest
    by = {d.knob: d for d in res.decisions}
    assert not by["alias"].kept and by["alias"].reason == "alias=1: the same launch at TP4"
    assert by["alias"].ratio is None  # not timed
    assert by["fast"].kept and res.kept == {"fast": 1}


def test_the_best_few_are_re_measured_not_the_first_alone(tmp_path):
    """Screening ranked a=1 first (95 µs) and b=1 second (97), but a is no faster than the default re-measured and b
    is: the top candidates are all measured against the default, and b is the one kept."""
    space = {"a": (0, 1), "b": (0, 1)}
    default = {"a": 0, "b": 0}
    ev = SyntheticEvaluator(lambda k: 97.0 if k["b"] and not k["a"] else 100.0, seed=8)
    trials = [(default, 100.0), ({"a": 1, "b": 0}, 95.0), ({"a": 0, "b": 1}, 97.0)]
    res = _decided(ev, space, default, trials, tmp_path)
    assert [c["knobs"] for c in res.candidates] == [{"a": 1}, {"b": 1}]
    assert res.kept == {"b": 1}


def test_a_knob_the_others_need_is_kept_with_why(tmp_path):
    """b is only correct with a (without a, b's launch fails its check): dropping a is not tried by timing; a is
    kept, saying the others need it and what its absence fails; b is kept on its own speed."""
    space = {"a": (0, 1), "b": (0, 1)}
    default = {"a": 0, "b": 0}
    reject = lambda k: "outside the bounds (b changed): y 3.1e-02 > 1e-02" if k["b"] and not k["a"] else None  # noqa: E731
    ev = SyntheticEvaluator(lambda k: 100.0 - 3 * k["b"], reject=reject, seed=4)
    res = _decided(ev, space, default, [(default, 100.0), ({"a": 1, "b": 1}, 97.0)], tmp_path)
    by = {d.knob: d for d in res.decisions}
    assert by["a"].kept and by["a"].reason == (
        "a=1: kept, the other knobs need it (without it: outside the bounds (b changed): y 3.1e-02 > 1e-02)"
    )
    assert {"a": 0, "b": 1} not in ev.timed  # the set that fails its check is never timed
    assert by["b"].kept and res.kept == {"a": 1, "b": 1} and res.evidence["ratio"] < 1


def test_knobs_kept_one_by_one_but_not_together_are_all_dropped(tmp_path):
    """Each knob beats the set without it (a and b alone 3% slower than both), but both together are only as
    fast as the default: the final measurement against the default drops them all, saying why."""
    space = {"a": (0, 1), "b": (0, 1)}
    default = {"a": 0, "b": 0}
    us = {(0, 0): 100.0, (1, 0): 103.0, (0, 1): 103.0, (1, 1): 100.0}
    ev = SyntheticEvaluator(lambda k: us[k["a"], k["b"]], seed=5)
    res = _decided(ev, space, default, [(default, 100.0), ({"a": 1, "b": 1}, 95.0)], tmp_path)
    assert res.kept == {} and res.evidence is None
    assert [d.knob for d in res.decisions] == ["a", "b"] and not any(d.kept for d in res.decisions)
    for d in res.decisions:
        assert "faster at TP4, kept; together" in d.reason and d.reason.endswith("not beyond δ: dropped")


def test_the_default_that_failed_its_own_check_is_an_error(tmp_path):
    """A study whose default never finished (its check failed) has no measure to keep anything against."""
    from glm53ctl.errors import CheckFailed

    ev = SyntheticEvaluator(lambda k: 100.0, reject=lambda k: "ValueError: no" if not k["a"] else None, seed=6)
    study = search(ev, {"a": 0}, {"a": (0, 1)}, _storage(tmp_path), "s", trials=2)
    with pytest.raises(CheckFailed, match="at TP8: the default's trial is not in the study's finished trials"):
        decide(ev, study, {"a": 0}, {"a": (0, 1)}, rounds=15, where="at TP8")


# the real checks (GpuEvaluator's, on the CPU under the interpreter) beside a synthetic timer


class CheckedOnTheCpu(GpuEvaluator):
    """tune's own evaluator on a CPU: its real identities and checks (the launches run in the interpreter); only
    the timer is synthetic, and it makes every set that should be rejected the fastest."""

    def __init__(self, weights, key, us) -> None:
        super().__init__(weights, key)
        self.synthetic = SyntheticEvaluator(us, seed=7)
        self.timed = self.synthetic.timed

    def timer(self, knobs):
        return self.synthetic.timer(knobs)


@pytest.fixture(scope="module")
def weights():
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    return Weights(load_model("tiny"), seed=0)


@pytest.mark.interpreter
def test_nothing_unproven_reaches_a_tuned_file(weights, tmp_path, monkeypatch):
    """tail at TP2 rows 2. block_n=16 gives other bits (planted: its launch's logits one ulp off), warps=8 is
    outside its bound (planted: the bounds at 0, so any numeric change fails), gathers=first fails to run
    (planted), and the timer makes each of them much the fastest; handoff=flag is a little faster and proven. The
    written file keeps handoff=flag alone and names no rejected knob as kept."""
    import torch

    from glm53ctl.kernels.kinds.tail.harness import TailHarness
    from glm53ctl.tuning.write import write_results
    from tests.helpers import resolved

    real_call = TailHarness.__call__

    def planted(self, x, *args, **kwargs):
        out = real_call(self, x, *args, **kwargs)
        if self.knobs.block_n == 16:
            out["logits"] = torch.nextafter(out["logits"], torch.full_like(out["logits"], float("inf")))
        if self.knobs.gathers == "first":
            raise RuntimeError("planted: this launch does not build")
        return out

    monkeypatch.setattr(TailHarness, "__call__", planted)
    key = resolved("tail", 2, 2)
    space = {"block_n": (64, 16), "warps": (4, 8), "gathers": ("last", "first"), "handoff": ("box", "flag")}
    fast = {"block_n": 16, "warps": 8, "gathers": "first"}

    def us(k: dict) -> float:
        return (
            100.0 * (0.5 if any(k[n] == v for n, v in fast.items()) else 1.0) * (0.97 if k["handoff"] == "flag" else 1)
        )

    ev = CheckedOnTheCpu(weights, key, us)
    assert ev.check(ev.default | {"warps": 8}) is None  # within the registry's bounds: a numeric knob passes
    ev.bounds = dict.fromkeys(ev.bounds, 0.0)
    default = ev.default
    assert {n: default[n] for n in space} == {"block_n": 64, "warps": 4, "gathers": "last", "handoff": "box"}
    study = search(ev, default, space, _storage(tmp_path), "s", trials=16)  # every point
    rejected = {json_key(t.params): t.user_attrs["rejected"] for t in study.get_trials() if t.state == PRUNED}
    assert rejected, "the search met none of the planted failures"
    for params, why in rejected.items():
        p = dict(params)
        assert p["block_n"] == 16 or p["warps"] == 8 or p["gathers"] == "first"
        assert why.startswith(
            ("not bitwise equal to the default: logits", "outside the bounds", "RuntimeError: planted")
        )
    assert not any(any(k[n] == v for n, v in fast.items()) for k in ev.timed)  # none of them timed
    res = decide(ev, study, default, space, rounds=15, where="at TP2 rows 2")
    assert res.trials["rejected"] == len([t for t in study.get_trials() if t.state == PRUNED]) == 14
    env = measure.environment("glm53ctl tune --kind tail --tp 2 --rows 2 --write")
    result = {"kind": "tail", "tp": 2, "rows": 2, "space": list(space), "base": {}} | res.to_json()
    (path,), _ = write_results("tiny", [result], env, root=tmp_path)
    entry = tuned.load(path).entry("tail", 2)
    assert not set(entry.knobs.items()) & set(fast.items())
    assert entry.knobs == {"handoff": "flag"}, [d.reason for d in res.decisions]  # the proven knob alone


def json_key(params: dict) -> tuple:
    return tuple(sorted(params.items()))
