"""What the kernels need of a model's dimensions (kernels/kinds/dims.py, each kind's DIMS): a model file they
cannot run is refused before any launch, naming the dimension, the rule and the nearest valid value, and
`configs validate` says which kinds and TP widths a file can run (issue 45: `hidden_size = 100` died in a 93-line
traceback from the interpreter)."""

import json
import re
from pathlib import Path

import pytest

from glm53ctl.kernels.kinds import kernel_kinds
from glm53ctl.kernels.kinds.fits import broken, runnable
from glm53ctl.kernels.spec import TP_WIDTHS, load_model, load_model_file
from glm53ctl.paths import config_root
from tests.helpers import invoke, invoke_json

KINDS = [*kernel_kinds(), "model"]


@pytest.fixture(autouse=True)
def _forget_model_files(monkeypatch):
    """A model file a command loads by its path is known by its name from then on, in this process: not past
    this test (`configs show` elsewhere lists the shipped models)."""
    from glm53ctl.kernels.spec import MODEL_FILES_ENV

    monkeypatch.setenv(MODEL_FILES_ENV, "")


def _model(tmp_path: Path, name: str, **changed) -> Path:
    """tiny's file as `name`, with `changed` ("moe.intermediate_size": 96) in it."""
    text = (config_root() / "models" / "tiny.toml").read_text().replace('name = "tiny"', f'name = "{name}"')
    for field, value in changed.items():
        group, key = field.split(".")
        section = text.index(f"[{group}]") if group != "model" else text.index("[model]")
        at = re.compile(rf"^{key} = .*$", re.M).search(text, section)
        text = text[: at.start()] + f"{key} = {value}" + text[at.end() :]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("model", ["tiny", "glm53_flash"])
def test_the_shipped_models_run_every_kind_at_every_width(model):
    assert runnable(load_model(model), KINDS, TP_WIDTHS) == {k: {t: [] for t in TP_WIDTHS} for k in KINDS}


def test_a_model_the_kernels_cannot_run_is_refused_before_any_launch(tmp_path, capsys):
    odd = _model(tmp_path, "odd", **{"model.hidden_size": 100})
    code, _, err = invoke(capsys, "run", "--kind", "embed", "--backend", "triton", "--model", str(odd), "--tp", "8",
                          "--out", str(tmp_path / "x.safetensors"))  # fmt: skip
    assert code == 2 and not (tmp_path / "x.safetensors").exists()
    assert err.splitlines()[-2] == (
        "Error: model 'odd' cannot run on the embed kernels at TP 8: model.hidden_size = 100: embed needs a power of "
        "two, or 1024 or more (an embed task's tl.arange over the columns); nearest model.hidden_size = 128"
    )
    assert "Traceback" not in err
    # the reference runs any model
    code, _, err = invoke(capsys, "run", "--kind", "embed", "--model", str(odd), "--tp", "8",
                          "--out", str(tmp_path / "ref.safetensors"))  # fmt: skip
    assert code == 0, err
    # and every command that launches refuses it, per key, before its first launch
    builds = ["build", "--kind", "tail", "-o", str(tmp_path / "b")]
    for args in (["check", "--kind", "tail"], ["fault", "--kind", "tail"], builds):
        code, _, err = invoke(capsys, *args, "--model", str(odd), "--tp", "2", "--rows", "1")
        assert code == 2 and "cannot run on the tail kernels at TP 2: model.hidden_size = 100" in err, (args, err)


@pytest.mark.interpreter
def test_past_the_refusal_the_launch_dies_where_the_rule_says(tmp_path):
    """The harness made directly (past the command's refusal) from hidden_size 100: tail's launch dies in the
    interpreter on its tl.arange over the hidden size, as the rule says it would."""
    from glm53ctl.kernels.checks import make_harness
    from glm53ctl.kernels.weights import Weights
    from tests.helpers import resolved

    spec = load_model_file(_model(tmp_path, "odd3", **{"model.hidden_size": 100}))
    k = make_harness(Weights(spec, seed=0), resolved("tail", 2, 1))
    with pytest.raises(Exception, match="power of 2"):
        k(k.inputs(0)[0], k.peer_partials(k.inputs(0)[0]))


def test_configs_validate_says_which_kinds_and_widths_a_file_runs(tmp_path, capsys):
    odd = _model(tmp_path, "odd2", **{"moe.intermediate_size": 96})
    doc = invoke_json(capsys, "configs", "validate", str(odd))
    (f,) = doc["files"]
    assert f["ok"] and f["kernels"]["embed"]["tp"] == [1, 2, 4, 8] and f["kernels"]["dense"]["tp"] == [1, 2, 4, 8]
    assert f["kernels"]["kda"]["tp"] == [] and f["kernels"]["sparse"]["tp"] == [] and f["kernels"]["model"]["tp"] == []
    assert f["kernels"]["kda"]["not"]["4"].startswith(
        "moe.intermediate_size / TP = 24 at TP 4 (moe.intermediate_size = 96): kda needs a power of two from 16 to "
        "256, or a multiple of 128 from 512 up"
    )
    code, out, _ = invoke(capsys, "configs", "validate", str(odd))
    assert code == 0 and "kda at no TP width" in out.replace("\n", " ")


# each declared rule, broken alone, names its field (and a value near it that holds)
BREAKS = [
    ("model.hidden_size", 100, "tail", 128),
    ("model.hidden_size", 1000, "embed", 1024),
    ("mhc.streams", 2, "tail", 4),
    ("kda.gate_rank", 24, "dense", 16),
    ("kda.head_dim", 24, "kda", None),
    ("moe.dense_intermediate_size", 200, "dense", None),
    ("moe.intermediate_size", 384, "kda", None),
    ("moe.n_group", 2, "kda", 1),
    ("mla.kv_lora_rank", 48, "sparse", None),
    ("mla.qk_nope_head_dim", 24, "sparse", None),
    ("mla.v_head_dim", 24, "sparse", None),
    ("mla.q_lora_rank", 100, "sparse", 96),
    ("indexer.head_dim", 24, "sparse", None),
    ("indexer.heads", 6, "sparse", None),
    ("indexer.kpool", 3, "sparse", None),  # with indexer.topk 24, a multiple of it (the schema's rule)
    # layer 3, the first DSA one, with the dense MLP: no layer kind runs it
    ("model.first_dense_layers", 4, "model", 3),
]


@pytest.mark.parametrize(("field", "value", "kind", "nearest"), BREAKS)
def test_each_rule_broken_alone_is_named(tmp_path, field, value, kind, nearest):
    try:
        also = {"indexer.topk": 24} if field == "indexer.kpool" else {}
        spec = load_model_file(_model(tmp_path, "bent", **{field: value}, **also))
    except Exception as e:  # a value the model's own schema refuses first (a cross-check) is no kernel rule's
        pytest.skip(f"the model schema refuses it: {e}")
    widths = [t for t in TP_WIDTHS if all(v % t == 0 for v in spec.sharded_dims().values())]
    said = [b for t in widths for b in broken(spec, kind, t)]
    # the rule on the field, and those on a product of it (heads x head_dim: a projection's K width)
    assert said and all(field in (b.dim.field, b.dim.times) for b in said), [str(b) for b in said]
    assert any(b.dim.field == field for b in said)
    if nearest is not None:
        assert said[0].nearest == nearest, str(said[0])
    assert json.dumps([str(b) for b in said])
