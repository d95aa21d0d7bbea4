import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from glm53ctl.kernels.kinds import KINDS
from glm53ctl.kernels.numerics import rel_rms
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
        (["--kind", "tail", "--rows", "0"], "--rows 0: expected 1 to 8"),
        # what check refuses, run refuses too (issue 30: it ran rows 3, which every command takes now: issue 45)
        (["--kind", "dense", "--rows", "9"], "--rows 9: expected 1 to 8"),
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


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "tail", "--tp", "2", "--gpus", "2"], "real ranks run the kernels"),
        (["--kind", "tail", "--tp", "4", "--gpus", "2", "--backend", "triton"], "--gpus 2 runs TP2"),
        (["--kind", "tail", "--tp", "2", "--gpus", "3", "--backend", "triton"], "one rank per GPU at a TP width"),
    ],
)
def test_run_on_real_ranks_misuse(capsys, tmp_path, args, message):
    code, _, err = invoke(capsys, "run", *args, "--out", tmp_path / "x.safetensors")
    assert code == 2 and message in err, err
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.interpreter
@pytest.mark.slow
def test_run_on_real_ranks_saves_every_ranks_outputs_bitwise_the_emulations(capsys, tmp_path):
    """`run --gpus T`: each rank a process of its own under the interpreter; rank 0's outputs (`outputs.*`) are
    the one-device run's bit for bit, every rank's saved as `ranks.<r>.*` (every rank holds the full result);
    with a weights file every rank reads its slice of it."""
    w = tmp_path / "w.safetensors"
    one, ranks = tmp_path / "one.safetensors", tmp_path / "ranks.safetensors"
    base = ["--backend", "triton", "--rows", "2", "--steps", "2", "--weights-seed", "5"]
    for kind, tp, extra in (("embed", 4, ["--tokens", "7,1000"]), ("tail", 2, ["--save-weights", w])):
        args = ["run", "--kind", kind, "--tp", str(tp), *base, *extra]
        code, _, err = invoke(capsys, *args, "--out", one)
        assert code == 0, err
        code, _, err = invoke(capsys, *args, "--gpus", str(tp), "--out", ranks)
        assert code == 0 and "every rank's outputs bitwise equal to rank 0's" in err, err
        a, b = load_file(str(one)), load_file(str(ranks))
        with safe_open(str(ranks), "pt") as f:
            assert f.metadata()["gpus"] == str(tp)
        assert {n for n in b if not n.startswith("ranks.")} == set(a)
        for n, t in a.items():
            assert torch.equal(t, b[n]), n
        outs = [n.removeprefix("outputs.") for n in a if n.startswith("outputs.")]
        assert {f"ranks.{r}.{n}" for r in range(tp) for n in outs} == {n for n in b if n.startswith("ranks.")}
        assert all(torch.equal(b[f"ranks.{r}.{n}"], a[f"outputs.{n}"]) for r in range(tp) for n in outs)
        code, _, err = invoke(capsys, "compare", one, ranks, "--only", "outputs.,inputs.")
        assert code == 0, err
    # the tail's weights from the file (drawn with seed 5 above): the same bits with another --weights-seed
    args = ["run", "--kind", "tail", "--tp", "2", *base[:-1], "0", "--weights", w, "--gpus", "2"]
    code, _, err = invoke(capsys, *args, "--out", tmp_path / "file.safetensors")
    assert code == 0, err
    file_run = load_file(str(tmp_path / "file.safetensors"))
    assert torch.equal(file_run["ranks.1.logits"], a["outputs.logits"])


@pytest.mark.parametrize(("kind", "tp", "rows"), [("dense", 2, 1), ("sparse", 4, 1)])
def test_a_layer_run_on_real_ranks_carries_each_ranks_state(capsys, tmp_path, kind, tp, rows):
    """`run --gpus T` of a layer kind over three steps: each rank carries its own state from step to step (its
    slices of the KDA state; `sparse`'s caches, which every rank writes, through a pool's completion), and the
    file saves what the one-device run saves bit for bit: the last step's inputs, rank 0's outputs and the
    state's writes (joined from the ranks' slices), with every rank's outputs as `ranks.<r>.*`."""
    one, ranks = tmp_path / "one.safetensors", tmp_path / "ranks.safetensors"
    args = ["run", "--kind", kind, "--tp", str(tp), "--rows", str(rows), "--context", "9", "--backend", "triton"]
    code, _, err = invoke(capsys, *args, "--steps", "3", "--out", one)
    assert code == 0, err
    code, _, err = invoke(capsys, *args, "--steps", "3", "--gpus", str(tp), "--out", ranks)
    assert code == 0 and "every rank's outputs bitwise equal to rank 0's" in err, err
    a, b = load_file(str(one)), load_file(str(ranks))
    assert {n for n in b if not n.startswith("ranks.")} == set(a)
    assert any(n.startswith("writes.") for n in a)
    for n, t in a.items():
        assert torch.equal(t, b[n]), n
    outs = [n.removeprefix("outputs.") for n in a if n.startswith("outputs.")]
    assert all(torch.equal(b[f"ranks.{r}.{n}"], a[f"outputs.{n}"]) for r in range(tp) for n in outs)
    # (a rank that read the prefilled state at every step would give other outputs and writes than these)


def test_the_steps_greedy_run_on_real_ranks(capsys, tmp_path):
    """`run --gpus 2 --kind model` over two greedy steps: every rank runs the whole step on its shards, takes the
    next token from the whole logits tail gathers on every rank (the same on each), and carries every layer's
    state; the file is the one-device run's bit for bit (the last step's tokens, the states before it joined from
    the ranks' slices, its outputs and writes), every rank's outputs as `ranks.<r>.*`."""
    one, ranks = tmp_path / "one.safetensors", tmp_path / "ranks.safetensors"
    args = ["run", "--kind", "model", "--tp", "2", "--rows", "1", "--context", "20", "--steps", "2"]
    args += ["--backend", "triton"]
    code, _, err = invoke(capsys, *args, "--out", one)
    assert code == 0, err
    code, _, err = invoke(capsys, *args, "--gpus", "2", "--out", ranks)
    assert code == 0 and "every rank's outputs bitwise equal to rank 0's" in err, err
    a, b = load_file(str(one)), load_file(str(ranks))
    assert {n for n in b if not n.startswith("ranks.")} == set(a)
    assert any(n.startswith("inputs.state.") and ".kda." in n for n in a) and "writes.layers.3.dsa.latent" in a
    for n, t in a.items():
        assert torch.equal(t, b[n]), n
    outs = [n.removeprefix("outputs.") for n in a if n.startswith("outputs.")]
    assert all(torch.equal(b[f"ranks.{r}.{n}"], a[f"outputs.{n}"]) for r in range(2) for n in outs)


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


@pytest.mark.interpreter
@pytest.mark.slow
def test_run_triton_backend_runs_whole_steps_greedily(capsys, tmp_path):
    """`run --kind model --backend triton`: steps of every layer's launch, each next token the argmax of the
    logits, every state carried; the same tokens, outputs and writes as the reference's run, within bounds."""
    from glm53ctl.kernels.kinds.model import BOUNDS

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    base = ["run", "--kind", "model", "--tp", "1", "--rows", "1", "--context", "5", "--steps", "2", "--seed", "3"]
    assert invoke(capsys, *base, "--out", a)[0] == 0
    code, _, err = invoke(capsys, *base, "--backend", "triton", "--out", b)
    assert code == 0, err
    ta, tb = load_file(str(a)), load_file(str(b))
    assert torch.equal(ta["inputs.tokens"], tb["inputs.tokens"])  # the first step's draw, then greedy
    for name in tb:
        bound = next((v for end, v in BOUNDS.items() if name.endswith(end)), None)
        if name.startswith(("outputs.", "writes.")) and bound is not None and tb[name].is_floating_point():
            assert rel_rms(ta[name], tb[name]) <= bound, name
        elif not tb[name].is_floating_point():
            assert torch.equal(ta[name].long(), tb[name].long()), name


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


@pytest.mark.parametrize("mode", [0o444, 0o000, 0o200])
def test_a_read_only_out_file_is_not_replaced(capsys, tmp_path, mode):
    """Before: a read-only (or unreadable) --out was silently replaced (as root) or refused in Typer's words."""
    out = tmp_path / "kept.safetensors"
    out.write_bytes(b"keep me")
    out.chmod(mode)
    code, _, err = invoke(capsys, "run", "--kind", "embed", "--out", out)
    out.chmod(0o644)
    assert code == 2 and "does not replace it" in err
    assert out.read_bytes() == b"keep me"


def test_written_files_honour_the_umask_and_keep_an_old_mode(capsys, tmp_path):
    """Before: every file written was 0600, whatever the umask."""
    import os

    old = os.umask(0o022)
    try:
        new = tmp_path / "new.safetensors"
        assert invoke(capsys, "run", "--kind", "embed", "--out", new)[0] == 0
        assert new.stat().st_mode & 0o777 == 0o644
        new.chmod(0o640)
        assert invoke(capsys, "run", "--kind", "embed", "--out", new)[0] == 0
        assert new.stat().st_mode & 0o777 == 0o640
        assert not list(tmp_path.glob(".*.tmp"))  # no temp file left behind
    finally:
        os.umask(old)


def test_bad_run_input_is_refused_before_any_work(tmp_path):
    """Before: rows, kind, steps, ... were checked after the progress line and torch's import (7-12 s). Now before
    the progress line, any weight or reference run, and nothing written (torch itself is imported with the
    command's module since issue 46: about 2 s)."""
    import subprocess
    import sys

    for args in (["--rows", "0"], ["--kind", "nope"], ["--steps", "0"], ["--context", "-1"], ["--layer", "5"]):
        argv = ["run", "--kind", "dense", "--out", str(tmp_path / "x.safetensors"), *args]
        code = "import sys\nfrom glm53ctl.cli import run_cli\nprint(run_cli(sys.argv[1:]))"
        p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
        assert p.stdout.split() == ["2"] and not list(tmp_path.iterdir()), (args, p.stdout, p.stderr)
        assert p.stderr.startswith("Error:") and "run tiny" not in p.stderr, p.stderr


def test_compare_two_runs_worst_first(capsys, tmp_path):
    """`glm53ctl compare`: every tensor's bits, relative RMS error and largest difference, the worst first (a
    user had to write Python to compare a reference run with a kernel run)."""
    from safetensors.torch import save_file

    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    save_file({"same": x, "close": x.clone(), "far": x.clone(), "gone": x.clone(), "ids": torch.arange(4)}, str(a))
    save_file({"same": x, "close": x * (1 + 1e-4), "far": x * 1.1, "ids": torch.arange(4)}, str(b))
    code, out, _ = invoke(capsys, "compare", a, b, "--json")
    assert code == 1  # "gone" is in A only: the runs do not hold the same tensors
    doc = json.loads(out)
    names = [t["tensor"] for t in doc["tensors"]]
    assert names[:3] == ["gone", "far", "close"] and set(names[3:]) == {"ids", "same"}
    rows = {t["tensor"]: t for t in doc["tensors"]}
    assert rows["same"]["equal"] and not rows["close"]["equal"] and rows["gone"]["problem"] == "only in A"
    assert abs(rows["far"]["rel_rms"] - 0.1) < 1e-6 and rows["close"]["rel_rms"] < 2e-4
    assert doc["summary"] == "2 of 5 tensors bitwise equal; 1 mismatched"
    code, _, err = invoke(capsys, "compare", a, b, "--bound", "1e-3")
    assert code == 1 and "over the bound" in err + _
    code, _, err = invoke(capsys, "compare", a, tmp_path / "nope.safetensors")
    assert code == 2 and "no such file" in err
    # --only: the names that start so (a run on real ranks against a one-device run compares its outputs.*)
    doc = invoke_json(capsys, "compare", a, b, "--only", "same,ids")
    assert sorted(t["tensor"] for t in doc["tensors"]) == ["ids", "same"] and doc["summary"].startswith("2 of 2")
    code, _, err = invoke(capsys, "compare", a, b, "--only", "outputs.")
    assert code == 2 and "no tensor of either run starts so" in err
    # NaN where the other has it too is equal; an int tensor of another width compares by value
    nan = torch.tensor([1.0, float("nan")])
    save_file({"n": nan, "i": torch.arange(3, dtype=torch.int32)}, str(a))
    save_file({"n": nan.clone(), "i": torch.arange(3)}, str(b))
    rows = {t["tensor"]: t for t in invoke_json(capsys, "compare", a, b, "--bound", "1e-3")["tensors"]}
    assert rows["n"]["equal"] and rows["n"]["rel_rms"] == 0 and rows["i"]["rel_rms"] == 0 and not rows["i"]["equal"]


def test_a_triton_run_records_the_kernels_precision_and_saves_inputs_as_the_reference_does(capsys, tmp_path):
    """Before: `run --backend triton` recorded the reference's `fp32` and saved H in bf16 where the reference
    run saves fp32, so the two runs' inputs compared as different."""
    ref, tri = tmp_path / "ref.safetensors", tmp_path / "tri.safetensors"
    assert invoke(capsys, "run", "--kind", "tail", "--out", ref)[0] == 0
    doc = invoke_json(capsys, "run", "--kind", "tail", "--backend", "triton", "--out", tri)
    assert doc["metadata"]["precision"] == "bf16 weights and hand-offs, fp32 sums"
    a, b = load_file(str(ref)), load_file(str(tri))
    assert a["inputs.H"].dtype == b["inputs.H"].dtype == torch.float32 and torch.equal(a["inputs.H"], b["inputs.H"])
    rows = {t["tensor"]: t for t in invoke_json(capsys, "compare", ref, tri)["tensors"]}
    assert rows["outputs.h_hat"]["dtypes"] == "float32 vs bfloat16" and rows["outputs.logits"]["rel_rms"] < 1e-2


def test_run_reads_a_hugging_face_checkpoint_folder(capsys, tmp_path):
    """`--weights DIR` (shards and their index, the checkpoint's names) gives the bits of the same weights drawn
    in memory; a checkpoint lacking a tensor is refused naming it."""
    from glm53ctl.kernels.spec import load_model
    from tests.kernels.test_weights import _checkpoint_folder

    ckpt, a, b = tmp_path / "ckpt", tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    ckpt.mkdir()
    _checkpoint_folder(ckpt, load_model("tiny"))
    base = ["run", "--kind", "kda", "--tp", "2", "--rows", "2"]
    assert invoke(capsys, *base, "--weights", ckpt, "--out", a)[0] == 0
    assert invoke(capsys, *base, "--weights-seed", "4", "--out", b)[0] == 0
    ta, tb = load_file(str(a)), load_file(str(b))
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    (ckpt / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    code, _, err = invoke(capsys, *base, "--weights", ckpt, "--out", a)
    assert code == 2 and "missing tensor 'model.language_model.embed_tokens.weight'" in err, err
