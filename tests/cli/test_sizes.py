"""Sizes past the model or the machine (issue 30): a `--context` past max_position_embeddings, or one whose caches or
prefill need more memory than there is, is refused before anything is allocated, naming what is needed and what
there is: exit 2, no traceback, nothing written. Before, `run --kind sparse --context 131072` died allocating
68.7 GB and `check --context 1e11` looped in the task table's builder, its memory growing."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from glm53ctl.kernels import sizes
from glm53ctl.kernels.spec import load_model
from tests.helpers import invoke

TOO_FAR = "100000000000"  # 1e11 tokens: past every model's positions


def _refused(capsys, *args, says: str) -> str:
    code, out, err = invoke(capsys, *args)
    assert code == 2 and out == "" and "Traceback" not in err, (args, code, err)
    assert err.startswith("Error:") and says in err, (args, err)
    return err


def test_run_past_the_machines_memory_is_refused_naming_both(capsys, tmp_path):
    out = tmp_path / "x.safetensors"
    err = _refused(
        capsys, "run", "--model", "glm53_flash", "--kind", "sparse", "--context", "131072", "--out", out, says="needs"
    )
    # what is needed (the prefill's index scores dwarf the caches) and what there is, in GB
    assert "the prefill of a 131,072-token row" in err and "GB free" in err and "Hint:" in err
    assert not out.exists()


def test_run_past_the_models_positions(capsys, tmp_path):
    err = _refused(
        capsys, "run", "--kind", "model", "--context", "65535", "--steps", "2", "--out", tmp_path / "x.safetensors",
        says="max_position_embeddings (65,536)",
    )  # fmt: skip
    assert "65,537 positions" in err and "--context 65534 at most with 2 steps" in err
    _refused(capsys, "run", "--kind", "sparse", "--context", TOO_FAR, "--out", tmp_path / "x.safetensors", says="past")


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--kind", "sparse", "--tp", "1", "--rows", "1", "--context", TOO_FAR],
        ["check", "--kind", "model", "--tp", "1", "--rows", "1", "--context", "65536"],
        ["bench", "--kind", "sparse", "--context", f"4096,{TOO_FAR}"],  # before the GPU is looked for
        ["tune", "--kind", "sparse", "--tp", "4", "--rows", "1", "--context", TOO_FAR],
    ],
)
def test_a_context_past_the_positions_is_refused_by_every_command(capsys, args):
    _refused(capsys, *args, says="max_position_embeddings")


def test_check_at_a_huge_context_ends_at_once(tmp_path):
    """The case that looped: in a child process, with a deadline (before the fix it never ended)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "glm53ctl",
            "check",
            "--kind",
            "sparse",
            "--tp",
            "1",
            "--rows",
            "1",
            "--context",
            TOO_FAR,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "max_position_embeddings" in r.stderr, r.stderr


def test_check_past_the_machines_memory_is_refused(capsys, monkeypatch):
    """Within the positions but not the memory: what the caches need beside what there is (a machine of 64 MB)."""
    monkeypatch.setattr(sizes, "host_available", lambda: 64 * 10**6)
    err = _refused(capsys, "check", "--kind", "sparse", "--tp", "1", "--rows", "8", "--context", "60000", says="needs")
    assert "the DSA caches of 1 layer at 8 rows" in err and "this machine has 64.0 MB free" in err


def test_the_cache_estimate_is_the_caches_size():
    """launch_needs counts the elements the DSA caches hold (kernels/spec.py's shapes), so its refusals are
    about real sizes: a layer kind's one layer, a step's every DSA layer."""
    for name in ("tiny", "glm53_flash"):
        spec = load_model(name)
        rows, context = 2, 41
        slots = sizes.slots(spec, context, 1)
        shapes = spec.shards(1).state_shapes(rows, slots)
        cells = sum(math.prod(shape) for n, shape in shapes.items() if n.startswith("dsa."))
        assert rows * slots * sizes.cache_elems_per_slot(spec) == cells
        dsa = sum(1 for attn, _ in spec.layers if attn == "dsa")
        step = sizes.launch_needs(spec, "model", rows, context, 1, "cpu")
        layer = sizes.launch_needs(spec, "sparse", rows, context, 1, "cpu")
        assert [n.bytes for n in step] == [dsa * n.bytes for n in layer]
        assert sizes.launch_needs(spec, "dense", rows, context, 1, "cpu") == []


def test_run_leaves_a_file_that_is_not_safetensors(capsys, tmp_path):
    """--out names a file that is there and is not a safetensors file: refused, the file as it was; an earlier
    run's output is replaced as before."""
    out = tmp_path / "notes.safetensors"
    out.write_text("my notes\n")
    _refused(capsys, "run", "--kind", "tail", "--out", out, says="not a safetensors file (left as it is)")
    assert out.read_text() == "my notes\n"
    good = tmp_path / "run.safetensors"
    assert invoke(capsys, "run", "--kind", "tail", "--out", good)[0] == 0
    before = good.read_bytes()
    assert invoke(capsys, "run", "--kind", "tail", "--seed", "1", "--out", good)[0] == 0
    assert good.read_bytes() != before
