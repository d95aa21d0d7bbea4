import json
import shutil

import pytest

from glm53ctl import tuned
from glm53ctl.errors import ConfigError
from glm53ctl.paths import config_root
from tests.helpers import invoke, invoke_json, write

PROVENANCE = {
    "glm53ctl": "0.1.0",
    "git_sha": "0123456789abcdef0123456789abcdef01234567",
    "git_dirty": False,
    "gpu_name": "NVIDIA H200",
    "gpu_capability": "9.0",
    "driver": "570.124.06",
    "cuda": "12.8",
    "torch": "2.11.0",
    "triton": "3.6.0",
    "date": "2026-11-30T01:00:00+00:00",
    "command": "glm53ctl tune --tp 4 --rows 2 --write",
    "study": "glm53_flash-tp4",
    "seed": 0,
}


def doc(**over):
    d = {
        "schema_version": 2,
        "model": "tiny",
        "tp": 4,
        "revision": 3,
        "provenance": dict(PROVENANCE),
        "entries": {
            "dense": {
                "2": {
                    "knobs": {"oproj_first": 1, "grid": 132},
                    "evidence": {
                        "default_us": 40.0,
                        "chosen_us": 38.0,
                        "ratio": 0.95,
                        "ratio_ci": [0.94, 0.96],
                        "delta": 0.01,
                        "samples": 30,
                    },
                    "dropped": [{"knob": "box_words", "value": 16, "reason": "0.4% faster, under delta 1%"}],
                }
            }
        },
    }
    d.update(over)
    return d


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A config root: the shipped models plus one tuned file."""
    shutil.copytree(config_root() / "models", tmp_path / "models")
    write(tmp_path / "tuned" / "tiny" / "tp4.json", json.dumps(doc()))
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path))
    return tmp_path


def test_round_trip(root):
    path = root / "tuned" / "tiny" / "tp4.json"
    cfg = tuned.load(path)
    assert cfg.entry("dense", 2).knobs == {"oproj_first": True, "grid": 132}
    assert cfg.entry("dense", 1) is None
    out = root / "elsewhere" / "copy.json"
    tuned.save(out, cfg)
    assert tuned.load(out) == cfg
    assert tuned.dump(tuned.load(out)) == tuned.dump(cfg)
    assert out.read_text().endswith("}\n")


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    path = write(tmp_path / "f.json", "old\n")

    def boom(*a):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        tuned.write_atomic(path, "new\n")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]  # no temp file left behind


def _bad(root, text):
    return write(root / "tuned" / "tiny" / "tp4.json", text)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["entries"]["dense"]["2"].update(knobz={}), r"tp4.json: entries.dense.2.knobz: unknown key"),
        (lambda d: d.update(revision="three"), r"tp4.json: revision: Input should be a valid integer"),
        (lambda d: d["provenance"].pop("git_sha"), r"tp4.json: provenance.git_sha: required key is missing"),
        (lambda d: d["entries"].update(warp={}), r"entries.warp.\[key\]: Value error, Input should be one of 'embed'"),
        (lambda d: d["entries"]["dense"].update({"9": {}}), r"tp4.json: entries.dense.9.\[key\]: Input should be less"),
        (lambda d: d["entries"]["dense"]["2"]["evidence"].update(ratio_ci=[1]), r"evidence.ratio_ci"),
        (lambda d: d.update(tp=2), r"tp4.json: tp: 2 does not match the file name 'tp4.json'"),
        (lambda d: d.update(model="glm53_flash"), r"model: 'glm53_flash' does not match the folder 'tiny'"),
    ],
)
def test_bad_tuned_file_names_file_key_and_expectation(root, mutate, expected):
    d = doc()
    mutate(d)
    with pytest.raises(ConfigError, match=expected):
        tuned.load(_bad(root, json.dumps(d)))


def test_malformed_json(root):
    with pytest.raises(ConfigError, match=r"tp4.json: not valid JSON"):
        tuned.load(_bad(root, '{"schema_version": 1,'))
    with pytest.raises(ConfigError, match=r"tp4.json: \(top level\): expected a JSON object"):
        tuned.load(_bad(root, "[1, 2]"))


def test_newer_schema_is_refused_naming_what_this_reads(root):
    with pytest.raises(ConfigError, match=r"schema_version 3 is newer than this glm53ctl reads \(up to 2\)"):
        tuned.load(_bad(root, json.dumps(doc(schema_version=3))))
    with pytest.raises(ConfigError, match=r"schema_version: expected a positive integer"):
        tuned.load(_bad(root, json.dumps(doc(schema_version="1"))))


def test_migration_chain_applies_steps_in_order(root, monkeypatch):
    """A fake v0 -> v1 step shows the chain runs and records where the file started."""
    monkeypatch.setitem(tuned.MIGRATIONS, 0, lambda d: {**d, "revision": d.pop("rev")})
    monkeypatch.setattr(tuned, "schema_version_of", lambda p, d: d["schema_version"])
    old = doc(schema_version=0)
    old["rev"] = old.pop("revision")
    migrated, start = tuned.migrate_document(root / "x.json", old)
    assert start == 0 and migrated["schema_version"] == tuned.SCHEMA_VERSION and migrated["revision"] == 3
    bad = doc(schema_version=0)
    with pytest.raises(ConfigError, match="missing key 'rev'"):
        tuned.migrate_document(root / "x.json", bad)


def test_lookup_precedence_and_provenance_warning(root):
    cfg = tuned.load(root / "tuned" / "tiny" / "tp4.json")
    defaults = {"oproj_first": False, "grid": 0, "warps": 4}
    knobs, source, warns = tuned.lookup(cfg, "dense", 2, defaults, "9.0", "3.6.1")
    assert knobs == {"oproj_first": True, "grid": 132, "warps": 4} and source == "tuned r3" and warns == []
    assert tuned.lookup(cfg, "dense", 1, defaults) == (defaults, "defaults", [])
    assert tuned.lookup(None, "dense", 2, defaults)[1] == "defaults"
    _, _, warns = tuned.lookup(cfg, "dense", 2, defaults, "10.0", "3.7.0")
    assert any("capability 9.0" in w for w in warns) and any("Triton 3.6.0" in w for w in warns)


def test_a_version_1_file_migrates_and_an_entry_keeps_its_context(root, capsys):
    """Version 2 records the context a kind that reads caches was tuned at: a version-1 file reads as tuned at
    the check's contexts; a key run at another context than its entry's is warned of, naming both and the tune
    to re-run; `configs diff` shows a changed context."""
    v1 = doc(schema_version=1)
    path = write(root / "tuned" / "tiny" / "tp4.json", json.dumps(v1))
    assert tuned.load(path).entry("dense", 2).context is None
    res = invoke_json(capsys, "configs", "migrate")
    assert res["files"][0]["status"] == "migrated schema_version 1 → 2"
    assert json.loads(path.read_text())["schema_version"] == 2

    d = doc(entries={"sparse": {"1": {"context": 32768, "knobs": {}}}})
    cfg = tuned.load_document(root / "x.json", d)
    defaults = {"grid": 0}
    assert tuned.context_warnings(cfg, "sparse", 1, 32768) == [] and tuned.lookup(cfg, "sparse", 1, defaults)[2] == []
    assert tuned.context_warnings(cfg, "sparse", 1, 4096) == [
        "tuned at context 32768, this key runs at context 4096",
        "re-run `glm53ctl tune --tp 4 --rows 1 --kind sparse --context 4096`",
    ]
    assert (
        tuned.context_warnings(cfg, "sparse", 1, None)[0]
        == "tuned at context 32768, this key runs at the check's contexts"
    )
    a = write(root / "a" / "tp4.json", json.dumps(d))
    d["entries"]["sparse"]["1"]["context"] = 4096
    b = write(root / "b" / "tp4.json", json.dumps(d))
    changes = invoke_json(capsys, "configs", "diff", str(a), str(b))["changes"]
    assert {"where": "sparse rows=1", "knob": "context", "a": 32768, "b": 4096} in changes


# ---- the CLI on real files ---------------------------------------------------------------------


def test_validate_passes_on_shipped_files(capsys):
    doc_ = invoke_json(capsys, "configs", "validate")
    assert doc_["ok"] and any(f["file"].endswith("glm53_flash.toml") for f in doc_["files"])


def test_validate_fails_exit_2_on_a_broken_copy(root, capsys):
    broken = root / "models" / "tiny.toml"
    broken.write_text(broken.read_text().replace("[indexer]\nheads = 4", "[indexer]\nheads = -4"))
    code, _, err = invoke(capsys, "configs", "validate")
    assert code == 2
    assert f"{broken}: indexer.heads: Input should be greater than 0" in err
    code, out, _ = invoke(capsys, "configs", "validate", "--json")
    assert code == 2 and json.loads(out)["ok"] is False


def test_show_lists_models_and_tuned_files(root, capsys):
    d = invoke_json(capsys, "configs", "show")
    assert {m["name"] for m in d["models"]} == {"tiny", "glm53_flash"}
    assert d["tuned"][0]["revision"] == 3 and d["tuned"][0]["tp"] == 4
    d = invoke_json(capsys, "configs", "show", "--model", "tiny", "--tp", "4")
    assert d["tuned"][0]["knobs"] == "grid=132, oproj_first=1"
    assert {"part": "kda", "tensor": "q_proj.weight", "shape": [32, 128]} in d["shards"]
    code, out, _ = invoke(capsys, "configs", "show")
    assert code == 0 and "tiny" in out


def test_show_refuses_a_tp_the_model_cannot_shard(capsys):
    code, out, err = invoke(capsys, "configs", "show", "--model", "tiny", "--tp", "16")
    assert code == 2 and out == "" and "TP 16 is not supported" in err


def test_diff(root, capsys):
    a = root / "tuned" / "tiny" / "tp4.json"
    d = doc(revision=4)
    d["entries"]["dense"]["2"]["knobs"]["grid"] = 66
    d["entries"]["tail"] = {"1": {"knobs": {"warps": 8}}}
    b = write(root / "b" / "tp4.json", json.dumps(d))
    res = invoke_json(capsys, "configs", "diff", str(a), str(b))
    changes = {(c["where"], c["knob"]): (c["a"], c["b"]) for c in res["changes"]}
    assert changes[("dense rows=2", "grid")] == (132, 66)
    assert changes[("revision", "")] == (3, 4)
    assert changes[("tail rows=1", "warps")] == (None, 8)
    assert invoke_json(capsys, "configs", "diff", str(a), str(a))["equal"] is True


def test_migrate_says_current(root, capsys):
    path = root / "tuned" / "tiny" / "tp4.json"
    before = path.read_text()
    res = invoke_json(capsys, "configs", "migrate")
    assert res["files"][0]["status"] == "current (schema_version 2)"
    assert path.read_text() == before
    code, _, err = invoke(capsys, "configs", "migrate", str(_bad(root, json.dumps(doc(schema_version=7)))))
    assert code == 2 and "schema_version 7 is newer than this glm53ctl reads (up to 2)" in err


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.update(revision="2"), r"revision: Input should be a valid integer"),
        (lambda d: d.update(revision=2.0), r"revision: Input should be a valid integer"),
        (lambda d: d.update(tp=4.0), r"tp: Input should be a valid integer"),
        (lambda d: d.update(tp=3), r"tp: Value error, expected one of 1, 2, 4, 8"),
        (lambda d: d["provenance"].update(git_dirty="off"), r"provenance.git_dirty: Input should be a valid boolean"),
        (lambda d: d["entries"]["dense"]["2"]["knobs"].update(grid=1.5), r"knobs.grid: Value error, expected a bool"),
        (lambda d: d["entries"]["dense"]["2"]["evidence"].update(ratio_ci=[0.96, 0.94]), r"expected \[low, high\]"),
    ],
)
def test_wrong_types_are_refused_strictly(root, mutate, expected):
    d = doc()
    mutate(d)
    with pytest.raises(ConfigError, match=expected) as e:
        tuned.load(_bad(root, json.dumps(d)))
    assert len(e.value.message.splitlines()) == 1  # one line per problem, not one per union member


def test_unreadable_files_are_config_errors(root, capsys):
    path = root / "tuned" / "tiny" / "tp4.json"
    path.write_bytes(b'{"schema_version": 1, "model": "\xff"}')
    with pytest.raises(ConfigError, match="tp4.json: not UTF-8 text"):
        tuned.load(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(ConfigError, match="tp4.json: is a folder"):
        tuned.load(path)
    code, _, err = invoke(capsys, "configs", "show")
    assert code == 2 and "is a folder" in err and "Traceback" not in err
    _bad(root / "x", '{"a": 1, "a": 2}')
    with pytest.raises(ConfigError, match="duplicate key 'a'"):
        tuned.read_document(root / "x" / "tuned" / "tiny" / "tp4.json")


def test_atomic_write_keeps_the_mode(tmp_path):
    path = write(tmp_path / "f.json", "old\n")
    path.chmod(0o644)
    tuned.write_atomic(path, "new\n")
    assert path.stat().st_mode & 0o777 == 0o644 and path.read_text() == "new\n"


def test_diff_sees_evidence_and_dropped(root, capsys):
    a = root / "tuned" / "tiny" / "tp4.json"
    d = doc()
    d["entries"]["dense"]["2"]["evidence"]["chosen_us"] = 37.0
    d["entries"]["dense"]["2"]["dropped"] = []
    b = write(root / "b" / "tp4.json", json.dumps(d))
    res = invoke_json(capsys, "configs", "diff", str(a), str(b))
    where = {c["knob"] for c in res["changes"]}
    assert {"evidence.chosen_us", "dropped"} <= where and not res["equal"]


def test_config_dir_must_exist_and_models_fall_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path / "absent"))
    code, _, err = invoke(capsys, "configs", "show")
    assert code == 2 and "GLM53CTL_CONFIG_DIR" in err and "no such folder" in err
    (tmp_path / "only_tuned" / "tuned").mkdir(parents=True)
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path / "only_tuned"))
    names = {m["name"] for m in invoke_json(capsys, "configs", "show")["models"]}
    assert names == {"tiny", "glm53_flash"}


def test_show_tp_needs_model(capsys):
    code, _, err = invoke(capsys, "configs", "show", "--tp", "4")
    assert code == 2 and "--tp needs --model" in err


@pytest.mark.parametrize(
    "entries, model, message",
    [
        (
            {"dense": {"2": {"knobs": {"warp_speed": 9}}}},
            "tiny",
            "entries.dense.2.knobs.warp_speed: 'warp_speed' is not",
        ),
        (
            {"tail": {"1": {"knobs": {"gathers": "sideways"}}}},
            "tiny",
            "entries.tail.1.knobs.gathers: 'sideways' is not a",
        ),
        ({"dense": {"1": {"dropped": [{"knob": "nope", "value": 1, "reason": "r"}]}}}, "tiny", "dropped.0: 'nope'"),
        ({}, "no_such_model", "model: unknown model 'no_such_model'"),
        ({"tail": {"1": {"knobs": {"grid": "abc"}}}}, "tiny", "knobs.grid: 'abc' is not a value of grid"),
        ({"tail": {"1": {"knobs": {"grid": -7}}}}, "tiny", "knobs.grid: -7 is not a value of grid"),
        ({"tail": {"1": {"knobs": {"poll": True}}}}, "tiny", "knobs.poll: True is not a value of poll"),
        ({"dense": {"1": {"context": 4096}}}, "tiny", "entries.dense.1.context: dense reads no caches"),
    ],
)
def test_validate_refuses_knobs_and_models_the_registry_does_not_know(capsys, tmp_path, entries, model, message):
    """A tuned file naming an unknown knob, a value outside a knob's values or an unknown model is invalid: the
    error names the file and the key path, and `validate` exits 2 (before: "1 of 1 files valid")."""
    path = write(tmp_path / "t.json", json.dumps(doc(entries=entries, model=model)))
    code, out, err = invoke(capsys, "configs", "validate", path)
    assert code == 2 and f"{path}: " in err and message in err, err
    assert "files valid" not in out


@pytest.mark.parametrize("tp", ["0", "3", "-1"])
def test_configs_show_refuses_a_tp_it_does_not_know(capsys, tp):
    """Before: `configs show --model tiny --tp 0` exited 0 and showed TP1."""
    code, out, err = invoke(capsys, "configs", "show", "--model", "tiny", "--tp", tp)
    assert code == 2 and out == "" and f"TP {tp} is not supported" in err


def test_a_tuned_entry_for_any_row_count_the_kernels_run(tmp_path, capsys):
    """Rows 3 is a key like any (configs validate agrees with what runs); rows 9 is not."""
    import json

    from glm53ctl.paths import config_root
    from tests.helpers import invoke

    doc = json.loads((config_root() / "tuned" / "glm53_flash" / "tp2.json").read_text())
    for rows, code in (("3", 0), ("9", 2)):
        d = json.loads(json.dumps(doc))
        d["entries"]["tail"] = {rows: {"knobs": {}, "dropped": [], "context": None, "evidence": None}}
        path = tmp_path / f"tp2-{rows}.json"
        path.write_text(json.dumps(d))
        got, _, err = invoke(capsys, "configs", "validate", str(path))
        assert got == code, err
        if code:
            assert "entries.tail.9.[key]: Input should be less than or equal to 8" in err
