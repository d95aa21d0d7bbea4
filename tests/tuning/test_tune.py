"""`glm53ctl tune` through its Python API on a CPU: real Optuna studies in real storage, a synthetic timer
(tests/tuning/synthetic.py) for the GPU's, the real keep rule, and a written file that the other commands use."""

import json
import shutil

import optuna
import pytest

from glm53ctl import tuned
from glm53ctl.paths import config_root
from glm53ctl.tuning import measure
from glm53ctl.tuning.tune import decide, search, space_of, storage_of, study_name
from tests.tuning.synthetic import SyntheticEvaluator

DEFAULT = {"fast": 0, "noise": 0, "slow": 0}
SPACE = {"fast": (0, 1), "noise": (0, 1), "slow": (0, 1)}


def true_us(k: dict) -> float:
    """fast: 3% faster; noise: 0.2% faster (inside the noise); slow: 3% slower."""
    return 100.0 * (0.97 if k["fast"] else 1.0) * (0.998 if k["noise"] else 1.0) * (1.03 if k["slow"] else 1.0)


def _storage(tmp_path):
    return storage_of(f"sqlite:///{tmp_path / 'studies.db'}")


def test_exhaustive_search_then_keep_only_the_knob_that_is_faster(tmp_path):
    ev = SyntheticEvaluator(true_us, noise=0.002, seed=1)
    study = search(ev, DEFAULT, SPACE, _storage(tmp_path), "s", trials=8)
    # 8 points, 8 trials: every point once (BruteForceSampler), the default first
    trials = study.get_trials()
    assert len(trials) == 8 and trials[0].params == DEFAULT
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 8
    res = decide(ev, study, DEFAULT, SPACE, top=3, rounds=15, where="at TP4 rows 2")
    assert res.kept == {"fast": 1}
    by = {d.knob: d for d in res.decisions}
    assert by["fast"].kept and "faster" in by["fast"].reason
    assert "noise" not in by or (not by["noise"].kept and "within the noise" in by["noise"].reason)
    assert res.evidence["ratio_ci"][1] < 1 - res.evidence["delta"]
    slow = by["slow"]  # timed alone in the search, slower: dropped with the search's numbers
    assert (
        not slow.kept and slow.reason.startswith("slow=1: 3.") and "slower at TP4 rows 2 in the search" in slow.reason
    )
    assert abs(res.evidence["ratio"] - 0.97) < 0.005


def _add(study, params: dict, value: float, ident: str) -> None:
    dists = {n: optuna.distributions.CategoricalDistribution(list(v)) for n, v in SPACE.items()}
    study.add_trial(
        optuna.trial.create_trial(params=params, distributions=dists, value=value, user_attrs={"identity": ident})
    )


def test_a_slower_knob_that_the_search_liked_is_dropped_with_its_number(tmp_path):
    """Screening is noisy: say it ranked fast+noise+slow best. Re-measured in A B B A rounds, slow is 3% slower
    (dropped, its number in the reason), noise within the noise (dropped), fast 3% faster (kept)."""
    ev = SyntheticEvaluator(true_us, noise=0.002, seed=2)
    study = optuna.create_study(study_name="s", storage=_storage(tmp_path))
    _add(study, DEFAULT, 100.0, ev.identity(DEFAULT))
    best = {"fast": 1, "noise": 1, "slow": 1}
    _add(study, best, 90.0, ev.identity(best))  # what a noisy screening said
    res = decide(ev, study, DEFAULT, SPACE, rounds=15, where="at TP2")
    by = {d.knob: d for d in res.decisions}
    assert (
        not by["slow"].kept
        and by["slow"].reason.startswith("slow=1: 3.")
        and "slower at TP2, dropped" in by["slow"].reason
    )
    assert not by["noise"].kept and "within the noise" in by["noise"].reason
    assert by["fast"].kept
    assert res.kept == {"fast": 1}


def test_nothing_kept_when_no_knob_beats_the_noise(tmp_path):
    ev = SyntheticEvaluator(lambda k: 100.0 * (0.998 if k["noise"] else 1.0), noise=0.002, seed=3)
    study = search(ev, DEFAULT, {"noise": (0, 1)}, _storage(tmp_path), "s", trials=2)
    res = decide(ev, study, DEFAULT, {"noise": (0, 1)}, rounds=15)
    assert res.kept == {} and res.evidence is None


def test_rejected_trials_are_recorded_with_why_and_never_chosen(tmp_path):
    """A trial that fails its check (bits or bounds) is pruned with the reason, however fast it would be."""
    reject = lambda k: "not bitwise equal to the default: H" if k["slow"] else None  # noqa: E731
    ev = SyntheticEvaluator(lambda k: 50.0 if k["slow"] else true_us(k), seed=4, reject=reject)
    study = search(ev, DEFAULT, SPACE, _storage(tmp_path), "s", trials=8)
    pruned = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.PRUNED]
    assert len(pruned) == 4 and all(t.user_attrs["rejected"].startswith("not bitwise") for t in pruned)
    assert all(not k["slow"] for k in ev.timed)  # never timed
    res = decide(ev, study, DEFAULT, SPACE, rounds=15)
    assert res.kept == {"fast": 1} and res.trials["rejected"] == 4


def test_a_trial_with_the_same_launch_is_not_timed_twice(tmp_path):
    """grid 0 is 396 programs on an H200: two knob sets, one launch; the second takes the first's value."""
    space = {"grid": (0, 132, 396)}
    canonical = lambda k: {**k, "grid": k["grid"] or 396}  # noqa: E731
    ev = SyntheticEvaluator(lambda k: 100.0 - (k["grid"] or 396) / 100, seed=5, canonical=canonical)
    study = search(ev, {"grid": 0}, space, _storage(tmp_path), "s", trials=3)
    assert len(ev.timed) == 2
    same = [t for t in study.get_trials() if "same_as" in t.user_attrs]
    assert len(same) == 1 and same[0].value == study.trials[same[0].user_attrs["same_as"]].value


def test_tpe_where_the_space_is_larger_than_the_trials(tmp_path):
    space = {f"k{i}": (0, 1, 2) for i in range(4)}  # 81 points
    ev = SyntheticEvaluator(lambda k: 100.0 - sum(k.values()), seed=6)
    study = search(ev, dict.fromkeys(space, 0), space, _storage(tmp_path), "s", trials=12)
    assert isinstance(study.sampler, optuna.samplers.TPESampler) and len(study.trials) == 12


def test_study_names_change_with_the_space_and_the_code():
    a = study_name("glm53_flash", "dense", 4, 2, {"oproj_first": (0, 1)}, "c0de")
    assert a.startswith("glm53_flash-dense-tp4-r2-")
    assert a != study_name("glm53_flash", "dense", 4, 2, {"oproj_first": (0, 1), "box_words": (8, 16, 32)}, "c0de")
    assert a != study_name("glm53_flash", "dense", 4, 2, {"oproj_first": (0, 1)}, "0ther")


def test_space_of_a_kind_and_a_chosen_part():
    from glm53ctl.errors import UsageError
    from glm53ctl.tuning.knobs import kind_knobs

    knobs = kind_knobs("dense")
    assert space_of(knobs, ["oproj_first", "box_words"]) == {"oproj_first": (0, 1), "box_words": (8, 16, 32)}
    assert set(space_of(knobs)) == set(knobs)
    with pytest.raises(UsageError, match="--space: nope"):
        space_of(knobs, ["nope"])


# --write: the file, and what the other commands then use


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    shutil.copytree(config_root() / "models", tmp_path / "models")
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path))
    return tmp_path


def _result(kind="dense", tp=4, rows=2, kept=None):
    kept = {"oproj_first": 1} if kept is None else kept
    return {
        "kind": kind,
        "tp": tp,
        "rows": rows,
        "kept": kept,
        "evidence": {
            "default_us": 75.0,
            "chosen_us": 73.0,
            "ratio": 0.973,
            "ratio_ci": (0.970, 0.976),
            "delta": 0.01,
            "samples": 60,
        }
        if kept
        else None,
        "decisions": [
            {
                "knob": "oproj_first",
                "value": 1,
                "kept": True,
                "reason": "oproj_first=1: 2.7% faster at TP4 rows 2, kept",
            },
            {"knob": "box_words", "value": 16, "kept": False, "reason": "box_words=16: 1.8% slower at TP4, dropped"},
        ],
    }


def test_a_written_file_validates_loads_and_changes_what_check_and_build_use(config_dir, capsys, tmp_path):
    from glm53ctl.kernels.build import for_build
    from glm53ctl.kernels.checks import make_harness
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights
    from glm53ctl.tuning.knobs import resolve_key
    from glm53ctl.tuning.write import add_changelog_line, changelog_line, write_results
    from tests.helpers import invoke

    env = measure.environment("glm53ctl tune --tp 4 --rows 2 --kind dense --write")
    before = resolve_key("tiny", "dense", 4, 2).knobs
    assert before["oproj_first"] == 0
    (path,), _ = write_results("tiny", [_result()], env, root=config_dir)
    assert path == config_dir / "tuned" / "tiny" / "tp4.json"
    cfg = tuned.load(path)
    assert cfg.revision == 1 and cfg.provenance.command.endswith("--write")
    entry = cfg.entry("dense", 2)
    assert entry.knobs == {"oproj_first": 1} and entry.evidence.ratio == 0.973
    assert [d.knob for d in entry.dropped] == ["box_words"] and "1.8% slower" in entry.dropped[0].reason
    code, _, err = invoke(capsys, "configs", "validate", str(path))
    assert code == 0, err
    # what check (its harness) and build (its key's knobs) use
    assert resolve_key("tiny", "dense", 4, 2).knobs.oproj_first == 1
    assert for_build(resolve_key("tiny", "dense", 4, 2)).knobs.oproj_first == 1
    assert for_build(resolve_key("tiny", "dense", 4, 1)).knobs == {**before, "grid": 396}
    k = make_harness(Weights(load_model("tiny"), seed=0), resolve_key("tiny", "dense", 4, 2, None, "cpu"))
    assert k.knobs.oproj_first == 1 and k.launch.constexprs()["sched"].OPROJ_FIRST
    # a second write keeps the other entries and bumps the revision
    (path,), _ = write_results("tiny", [_result(rows=8, kept={})], env, root=config_dir)
    cfg = tuned.load(path)
    assert cfg.revision == 2 and cfg.entry("dense", 2).knobs == {"oproj_first": 1}
    assert cfg.entry("dense", 8).knobs == {} and cfg.entry("dense", 8).evidence is None
    # a kind that reads caches, tuned at a context: its entry says which (the line too); its key at another context
    # carries the warning (the command prints it)
    at_32k = _result("sparse", rows=1, kept={}) | {"context": 32768, "decisions": []}
    (path,), _ = write_results("tiny", [at_32k], env, root=config_dir)
    cfg = tuned.load(path)
    assert cfg.entry("sparse", 1).context == 32768 and cfg.entry("dense", 8).context is None
    assert "sparse rows 1 at context 32768 keeps the defaults" in changelog_line(path, cfg, [at_32k])
    # once per key that check or bench runs, not per harness (a step has a sparse harness per DSA layer): the
    # resolved key says it, nothing below the command prints
    capsys.readouterr()
    assert resolve_key("tiny", "sparse", 4, 1).warnings == ()
    assert resolve_key("tiny", "sparse", 4, 1, None, "cpu", 32768, context_warned=True).warnings == ()
    warned = resolve_key("tiny", "sparse", 4, 1, None, "cpu", 4096, context_warned=True).warnings
    assert "tuned at context 32768, this key runs at context 4096" in warned[0]
    assert capsys.readouterr().err == ""
    # the CHANGELOG line goes first under Unreleased / Changed
    log = tmp_path / "CHANGELOG.md"
    log.write_text("# Changelog\n\n## [Unreleased]\n\n### Added\n\n- a\n\n## [0.1.0]\n\n- old\n")
    add_changelog_line(log, "- Tuned x")
    add_changelog_line(log, "- Tuned y")
    text = log.read_text()
    assert text.index("### Changed") < text.index("- Tuned y") < text.index("- Tuned x") < text.index("## [0.1.0]")


def test_plots_of_a_study_run_elsewhere(tmp_path, capsys, monkeypatch):
    """`tune --plots` on a machine with no GPU draws the studies in the storage a GPU filled."""
    from tests.helpers import invoke

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    ev = SyntheticEvaluator(true_us, seed=7)
    search(ev, DEFAULT, SPACE, storage_of(url), "s", trials=8)
    args = ["tune", "--tp", "4", "--rows", "2", "--kind", "dense", "--storage", url, "--study", "s"]
    code, _, err = invoke(capsys, *args, "--plots", str(tmp_path / "plots"))
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["s-history.png", "s-importances.png"]
    code, _, err = invoke(capsys, *args[:-1], "nope", "--plots", str(tmp_path / "plots"))
    assert code == 2 and "no study 'nope'" in err and "its studies: s" in err


def test_a_search_of_part_of_the_space_holds_and_keeps_the_tuned_knobs_outside_it(config_dir):
    """`tune --space launch` after a `block_n_down` tune: the search runs beside the tuned block_n_down (base_of)
    and --write keeps it, with its evidence where the search kept nothing and its reasons."""
    from glm53ctl.tuning.knobs import kind_knobs, resolve_key
    from glm53ctl.tuning.tune import base_of, space_of, study_name
    from glm53ctl.tuning.write import changelog_line, write_results

    env = measure.environment("glm53ctl tune --kind kda --tp 4 --rows 2,8 --space block_n_down,box_words --write")
    first = _result("kda", rows=2, kept={"block_n_down": 128}) | {
        "space": ["block_n_down", "box_words"],
        "base": {},
        "decisions": [
            {"knob": "block_n_down", "value": 128, "kept": True, "reason": "block_n_down=128: 2.9% faster, kept"},
            {"knob": "box_words", "value": 8, "kept": False, "reason": "box_words=8: 11% slower, dropped"},
        ],
    }
    (path,), _ = write_results("tiny", [first, first | {"rows": 8}], env, root=config_dir)
    key = resolve_key("tiny", "kda", 4, 2)
    space = space_of(kind_knobs("kda"), ["launch"])
    assert base_of(key, space) == {"block_n_down": 128}
    assert base_of(key, space_of(kind_knobs("kda"))) == {}  # the whole space: nothing held
    assert study_name("tiny", "kda", 4, 2, space, "c") != study_name("tiny", "kda", 4, 2, space, "c", {"x": 1})

    def launch_result(rows, kept):
        return _result("kda", rows=rows, kept=kept) | {
            "space": ["launch"],
            "base": {"block_n_down": 128},
            "decisions": [
                {"knob": "launch", "value": "stages", "kept": bool(kept), "reason": "launch=stages: measured"},
            ],
        }

    nothing, stages = launch_result(2, {}), launch_result(8, {"launch": "stages"})
    (path,), _ = write_results("tiny", [nothing, stages], env, root=config_dir)
    cfg = tuned.load(path)
    r2, r8 = cfg.entry("kda", 2), cfg.entry("kda", 8)
    assert r2.knobs == {"block_n_down": 128} and r2.evidence.ratio == 0.973  # the held knob's own evidence
    assert [(d.knob, d.value) for d in r2.dropped] == [("box_words", 8), ("launch", "stages")]
    assert r8.knobs == {"block_n_down": 128, "launch": "stages"}
    assert resolve_key("tiny", "kda", 4, 8).knobs.launch == "stages"
    line = changelog_line(path, cfg, [nothing, stages])
    assert "kda rows 2 keeps the defaults beside block_n_down=128" in line
    kept = "kda rows 8 keeps launch=stages (0.973× the µs with block_n_down=128 alone), holding block_n_down=128"
    assert kept in line


def test_the_steps_schedule_tuned_per_width_like_any_kinds(config_dir):
    """`tune --kind model --space launch`: the step's knob `launch` (parts | persistent | stages) is searched like
    any kind's; a written entry changes the step at that key only, handing the schedule to every part while each
    part keeps its own kind's other tuned knobs."""
    from glm53ctl.tuning.knobs import kind_knobs, resolve_key
    from glm53ctl.tuning.write import write_results

    assert space_of(kind_knobs("model"), ["launch"]) == {"launch": ("parts", "persistent", "stages")}
    env = measure.environment("glm53ctl tune --tp 2 --rows 1 --kind model --space launch --write")
    step = _result("model", tp=2, rows=1, kept={"launch": "stages"}) | {"decisions": []}
    write_results("tiny", [step], env, root=config_dir)
    key = resolve_key("tiny", "model", 2, 1)
    assert key.knobs.launch == "stages" and all(p.knobs.launch == "stages" for p in key.parts)
    assert resolve_key("tiny", "model", 2, 8).knobs.launch == "parts"  # another width keeps the default
    dense = next(p for p in key.parts if p.kind == "dense")
    assert {k: v for k, v in dense.knobs.items() if k != "launch"} == {
        k: v for k, v in resolve_key("tiny", "dense", 2, 1).knobs.items() if k != "launch"
    }
