from dataclasses import replace

import pytest

from glm53ctl.errors import ConfigError, UsageError
from glm53ctl.kernels.kinds import KINDS, get_kind, kernel_kinds
from glm53ctl.kernels.kinds.base import knob_record
from glm53ctl.kernels.kinds.layer.launch import LayerLaunch
from glm53ctl.kernels.spec import load_model
from glm53ctl.tuning.knobs import RUNTIME_KNOBS, check_knobs, defaults, kind_knobs, resolve_grid


def test_every_knob_default_is_one_of_its_values():
    for kind in kernel_kinds():
        for k in kind_knobs(kind).values():
            assert k.default in k.values and k.cls in ("schedule", "numeric"), (kind, k.name)
    for k in RUNTIME_KNOBS.values():
        assert k.default in k.values


def test_a_kind_declares_its_own_knobs_and_takes_runtime_knobs_by_name():
    """A kind's knobs are declared in its folder; the runtime's once; no name declared twice for a kind."""
    for name, kind in KINDS.items():
        assert set(kind.runtime) <= set(RUNTIME_KNOBS) and set(kind.runtime_defaults) <= set(kind.runtime), name
        own = [k.name for k in kind.knobs]
        assert len(own) == len(set(own)) and not set(own) & set(RUNTIME_KNOBS), name
    assert [k for k, v in KINDS.items() if v.has_kernels and not v.composite] == list(kernel_kinds())
    assert list(kernel_kinds()) == ["embed", "dense", "kda", "sparse", "tail"]
    assert [k for k, v in KINDS.items() if v.composite] == ["model"]


def test_the_defaults_are_the_measured_ones():
    """Pinned: a default changes only with evidence in docs/perf (and this test changed in the same commit)."""
    assert defaults("embed") == {
        "grid": 0,
        "warps": 4,
        "handoff": "box",
        "poll": 1,
        "launch": "persistent",
        "chunk": 1024,
    }
    tail = {
        "launch": "persistent",
        "grid": 0,
        "warps": 4,
        "handoff": "box",
        "poll": 1,
        "stages": 3,
        "block_n": 64,
        "block_k": 128,
    }
    assert defaults("tail") == tail | {"gathers": "last", "split": "even", "norm": "fold"}
    dense = {
        "launch": "persistent",
        "grid": 0,
        "warps": 4,
        "handoff": "box",
        "poll": 0,
        "stages": 4,
        "block_n_in": 32,
        "block_n_gu": 32,
    }
    dense |= {"block_n_out": 32, "box_words": 32, "oproj_first": 0, "kda_split": 0, "chunk_cols": 128, "ksplit": 2}
    dense |= {"ksplit_gu": 2, "ksplit_in": 1, "block_k": 128, "maxnreg": 0, "prefetch": 3, "weights_first": 0}
    dense |= {"ffn_mix": "auto", "stage_code": "shared"}
    assert defaults("dense") == dense | {"norm": "auto"}
    assert defaults("model") == {"grid": 0, "launch": "parts", "chain": "stream"}


def test_defaults_per_kind():
    assert set(defaults("tail")) >= {"grid", "handoff", "poll", "block_n", "block_k", "stages", "warps"}
    assert defaults("tail")["stages"] == 3 and defaults("dense")["stages"] == 4  # a per-kind default
    assert "block_n" not in defaults("embed") and "chunk" in defaults("embed")


def test_bad_knobs_are_refused():
    with pytest.raises(UsageError, match="knob 'chunk' does not apply to tail"):
        check_knobs("tail", {"chunk": 256})
    with pytest.raises(UsageError, match="knob handoff='mail': expected one of flag, box"):
        check_knobs("tail", {"handoff": "mail"})


def test_grid_zero_resolves_per_device():
    assert resolve_grid({"grid": 0}, "cpu")["grid"] == 4
    assert resolve_grid({"grid": 7}, "cpu")["grid"] == 7


def test_launches_take_the_tuned_entry_of_their_key(tmp_path, monkeypatch):
    """Defaults, then configs/tuned/<model>/tp<T>.json's entry for (kind, rows), then explicit knobs."""
    import json
    import shutil

    from glm53ctl.kernels.checks import make_harness
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights
    from glm53ctl.paths import config_root
    from glm53ctl.tuning.knobs import resolve_key
    from tests.configs.test_tuned import doc

    shutil.copytree(config_root() / "models", tmp_path / "models")
    d = doc(model="tiny", tp=4)
    d["entries"] = {"tail": {"2": {"knobs": {"block_n": 32, "handoff": "flag"}}}}
    (tmp_path / "tuned" / "tiny").mkdir(parents=True)
    (tmp_path / "tuned" / "tiny" / "tp4.json").write_text(json.dumps(d))
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path))
    w = Weights(load_model("tiny"))
    assert make_harness(w, resolve_key("tiny", "tail", 4, 2, {}, "cpu")).knobs.block_n == 32
    key = resolve_key("tiny", "tail", 4, 2, {}, "cpu")
    assert key.knobs.handoff == "flag" and key.source == "tuned r3"
    assert resolve_key("tiny", "tail", 4, 1, {}, "cpu").knobs == {**defaults("tail"), "grid": 4}
    assert resolve_key("tiny", "tail", 4, 2, {"block_n": 64}, "cpu").knobs.block_n == 64
    # a variant of the key (a check's other grid, a tune trial) keeps the tuned entry and reads no file again
    assert key.with_knobs({"grid": 3}).knobs == key.knobs.replace(grid=3)
    d["entries"] = {"tail": {"2": {"knobs": {"chunk": 256}}}}
    (tmp_path / "tuned" / "tiny" / "tp4.json").write_text(json.dumps(d))
    # a tuned file naming another kind's knob is refused naming the file and the key path
    with pytest.raises(ConfigError, match=r"tp4.json: entries.tail.2.knobs.chunk: 'chunk' is not a knob of tail"):
        resolve_key("tiny", "tail", 4, 2, {}, "cpu")


def test_a_key_carries_its_kinds_knobs_as_a_typed_record():
    """The record of a kind's knobs has one field per knob the registry declares, typed and defaulting as
    declared; a value of another type is refused; it reads as a mapping equal to the dict of its items and
    crosses to a worker process (pickled) as the same kind's record."""
    import pickle

    from glm53ctl.tuning.knobs import resolve_key

    for kind in kernel_kinds() + ("model",):
        record = KINDS[kind].record
        assert list(record.__dataclass_fields__) == list(kind_knobs(kind)), kind
        assert record() == defaults(kind) and dict(record()) == defaults(kind)
        for name, knob in kind_knobs(kind).items():
            assert record.__dataclass_fields__[name].type is type(knob.default), (kind, name)
    key = resolve_key("tiny", "dense", 4, 2, {"block_k": 64}, "cpu")
    assert type(key.knobs).__name__ == "DenseKnobs" and key.knobs.block_k == 64 and key.knobs.grid == 4
    assert pickle.loads(pickle.dumps(key)) == key and pickle.loads(pickle.dumps(key.knobs)).block_k == 64
    assert key.with_knobs({"grid": 8}).knobs.grid == 8 and key.knobs.grid == 4  # a variant; the key unchanged
    with pytest.raises(TypeError, match="block_k='64'"):
        key.knobs.replace(block_k="64")
    with pytest.raises(TypeError):
        key.knobs.replace(no_such_knob=1)
    with pytest.raises(AttributeError):  # frozen
        key.knobs.block_k = 32


def test_kernels_read_knobs_by_field_not_by_string():
    """Nothing under kernels/ (launches, tables, harnesses, the runtime) reads a knob as `knobs["name"]`: a knob
    is a field of its kind's record (a renamed or removed knob fails where it is read, not with a KeyError at
    run time). Shared code reads a knob some kinds lack with `knobs.get(name, default)`."""
    import ast
    from pathlib import Path

    import glm53ctl.kernels as kernels

    found = []
    for path in Path(kernels.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
                and (getattr(node.value, "id", None) or getattr(node.value, "attr", None)) == "knobs"
            ):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def test_a_knob_the_code_reads_reaches_the_layer_kernel_whole():
    """A knob declared `code=True` needs nothing but its declaration and the body that reads it: the record carries
    it into the launch's constexprs (`sched.KNOB.<name>`), with its value at the key, and no other knob is there."""
    kind = get_kind("dense")
    declared = kind.all_knobs()
    assert all(not k.code for k in declared.values())  # today every knob the code reads has a field of its own
    probe = replace(next(iter(declared.values())), name="probe", values=(0, 1), default=0, code=True)
    record = knob_record("dense", {**declared, "probe": probe})
    assert record().code() == record.CODE(probe=0) and record.CODE._fields == ("probe",)
    knobs = record().replace(probe=1)
    sched = LayerLaunch(load_model("tiny"), 1, 1, knobs, "cpu").constexprs()["sched"]
    assert sched.KNOB.probe == 1 and sched.KNOB._fields == ("probe",)
    assert LayerLaunch(load_model("tiny"), 1, 1, kind.record(), "cpu").constexprs()["sched"].KNOB == ()
