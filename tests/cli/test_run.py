import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from glm53ctl.kernels.kinds import KINDS
from tests.helpers import invoke, invoke_json


@pytest.mark.parametrize("kind", KINDS)
def test_run_every_kind_on_tiny(capsys, tmp_path, kind):
    out = tmp_path / f"{kind}.safetensors"
    doc = invoke_json(capsys, "run", "--kind", kind, "--tp", "2", "--rows", "2", "--context", "37", "--out", out)
    assert all(t["finite"] for t in doc["tensors"])
    tensors = load_file(str(out))
    with safe_open(str(out), "pt") as f:
        meta = f.metadata()
    assert meta["kind"] == kind and meta["model"] == "tiny" and meta["tp"] == "2" and meta["backend"] == "reference"
    assert any(k.startswith("outputs.") for k in tensors)
    assert any(k.startswith("inputs.") for k in tensors)
    if kind in ("dense", "kda", "sparse", "model"):
        assert any(k.startswith("writes.") for k in tensors)
        assert tensors["inputs.pos"].tolist() == [37, 34]
    if kind == "sparse":
        idx = tensors["outputs.dsa.idx"]
        assert idx.shape == (2, 35) and int((idx >= 0).sum(1).max()) < 38  # pools dropped


def test_run_is_reproducible_and_seeded(capsys, tmp_path):
    a, b, c = (tmp_path / f"{n}.safetensors" for n in "abc")
    for path, seed in ((a, "1"), (b, "1"), (c, "2")):
        code, _, err = invoke(
            capsys, "run", "--kind", "sparse", "--rows", "2", "--context", "9", "--seed", seed, "--out", path
        )
        assert code == 0, err
    ta, tb, tc = load_file(str(a)), load_file(str(b)), load_file(str(c))
    assert all(torch.equal(ta[k], tb[k]) for k in ta)
    assert not torch.equal(ta["outputs.H"], tc["outputs.H"])


def test_run_with_saved_weights_file(capsys, tmp_path):
    w = tmp_path / "w.safetensors"
    first, second = tmp_path / "1.safetensors", tmp_path / "2.safetensors"
    code, _, err = invoke(capsys, "run", "--kind", "tail", "--weights-seed", "3", "--out", first, "--save-weights", w)
    assert code == 0, err
    code, _, err = invoke(capsys, "run", "--kind", "tail", "--weights", w, "--out", second)
    assert code == 0, err
    assert torch.equal(load_file(str(first))["outputs.logits"], load_file(str(second))["outputs.logits"])
    code, _, err = invoke(capsys, "run", "--kind", "embed", "--weights", w, "--out", second)
    assert code == 2 and "missing tensor 'model.language_model.embed_tokens.weight'" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "attn"], "unknown kind 'attn'"),
        (["--kind", "tail", "--tp", "3"], "TP 3 is not supported"),
        (["--kind", "tail", "--rows", "9"], "rows 9 is out of range"),
        (["--kind", "kda", "--layer", "3"], "not a kda layer"),
        (["--kind", "tail", "--model", "nope"], "unknown model 'nope'"),
        (["--kind", "tail", "--weights", "absent.safetensors"], "no such weights file"),
    ],
)
def test_run_bad_input_is_a_clear_error(capsys, tmp_path, args, message):
    out = tmp_path / "x.safetensors"
    code, stdout, err = invoke(capsys, "run", *args, "--out", out)
    assert code == 2 and stdout == "" and message in err and "Traceback" not in err
    assert not out.exists()


def test_run_out_must_be_safetensors_in_an_existing_folder(capsys, tmp_path):
    code, _, err = invoke(capsys, "run", "--kind", "tail", "--out", tmp_path / "x.pt")
    assert code == 2 and "expected a .safetensors file" in err
    code, _, err = invoke(capsys, "run", "--kind", "tail", "--out", tmp_path / "no" / "x.safetensors")
    assert code == 2 and "does not exist" in err


def test_reloaded_weights_give_the_same_bits(capsys, tmp_path):
    w, a, b = (tmp_path / f"{n}.safetensors" for n in ("w", "a", "b"))
    assert invoke(capsys, "run", "--kind", "kda", "--rows", "2", "--out", a, "--save-weights", w)[0] == 0
    assert invoke(capsys, "run", "--kind", "kda", "--rows", "2", "--weights", w, "--out", b)[0] == 0
    ta, tb = load_file(str(a)), load_file(str(b))
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


def test_run_tokens_are_used_and_checked(capsys, tmp_path):
    out = tmp_path / "e.safetensors"
    assert invoke(capsys, "run", "--kind", "embed", "--rows", "2", "--tokens", "5,9", "--out", out)[0] == 0
    assert load_file(str(out))["inputs.tokens"].tolist() == [5, 9]
    for args, msg in (
        (["--tokens", "5,1024"], "token id 1024 is out of range [0, 1024)"),
        (["--tokens", "5"], "--tokens has 1 ids for 2 rows"),
        (["--tokens", "5,x"], "expected comma-separated integers"),
    ):
        code, _, err = invoke(capsys, "run", "--kind", "embed", "--rows", "2", *args, "--out", out)
        assert code == 2 and msg in err, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "tail", "--layer", "1"], "--layer applies to the layer kinds"),
        (["--kind", "kda", "--steps", "0"], "--steps 0: expected at least 1"),
        (["--kind", "kda", "--context", "-1"], "--context -1: expected 0 or more"),
        (["--kind", "tail", "--tokens", "1"], "--tokens applies to embed and model"),
    ],
)
def test_run_option_misuse(capsys, tmp_path, args, message):
    code, _, err = invoke(capsys, "run", *args, "--out", tmp_path / "x.safetensors")
    assert code == 2 and message in err, err


def test_run_refuses_unwritable_outputs_before_running(capsys, tmp_path):
    (tmp_path / "d.safetensors").mkdir()
    code, _, err = invoke(capsys, "run", "--kind", "tail", "--out", tmp_path / "d.safetensors")
    assert code == 2 and "is a folder" in err
    code, _, err = invoke(
        capsys, "run", "--kind", "tail", "--out", tmp_path / "o.safetensors", "--save-weights", tmp_path / "w.txt"
    )
    assert code == 2 and "--save-weights" in err and not (tmp_path / "o.safetensors").exists()


@pytest.mark.interpreter
@pytest.mark.parametrize("kind", ["embed", "tail"])
def test_run_triton_backend_matches_the_reference(capsys, tmp_path, kind):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    base = ["run", "--kind", kind, "--tp", "2", "--rows", "2", "--seed", "4"]
    assert invoke(capsys, *base, "--out", a)[0] == 0
    code, _, err = invoke(capsys, *base, "--backend", "triton", "--out", b)
    assert code == 0, err
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.allclose(ta[k].float(), tb[k].float(), rtol=1e-2, atol=1e-2), k


def test_run_triton_backend_refuses_kinds_without_kernels(capsys, tmp_path):
    code, _, err = invoke(capsys, "run", "--kind", "kda", "--backend", "triton", "--out", tmp_path / "x.safetensors")
    assert code == 2 and "no kda launch yet" in err


@pytest.mark.interpreter
def test_run_triton_backend_dense_saves_the_reference_layout(capsys, tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    base = ["run", "--kind", "dense", "--tp", "2", "--rows", "1", "--context", "3", "--seed", "2"]
    assert invoke(capsys, *base, "--out", a)[0] == 0
    code, _, err = invoke(capsys, *base, "--backend", "triton", "--out", b)
    assert code == 0, err
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys() and "writes.layers.0.kda.recurrent" in tb
    for k in ta:
        assert torch.allclose(ta[k].float(), tb[k].float(), rtol=2e-2, atol=2e-2), k
