"""A kind is one folder, proven: tests/toy_kind/ (its facts and registry line, table, kernel, launch, harness and
reference) and $GLM53CTL_KINDS naming it are all it takes for `check`, `fault`, `build` and `run` to take it, in
this process and in the worker processes they spawn (which inherit the environment), with no other file touched.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "tests" / "toy_kind"

pytestmark = pytest.mark.interpreter


def glm53ctl(*args, timeout: int = 600) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, the toy kind registered: one environment variable (the registry line is
    the folder's `KIND`)."""
    env = {**os.environ, "GLM53CTL_KINDS": "tests.toy_kind", "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "glm53ctl", *map(str, args)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_toy_kind_is_its_folder_and_one_line():
    assert sorted(p.name for p in FOLDER.glob("*.py")) == [
        "__init__.py",
        "harness.py",
        "kernel.py",
        "launch.py",
        "table.py",
    ]
    assert [line for line in (FOLDER / "__init__.py").read_text().splitlines() if line.startswith("KIND = Kind(")]
    p = glm53ctl("run", "-h")
    assert p.returncode == 0 and "tail, model or toy" in p.stdout  # the help lists the registry's kinds


def test_check_and_fault_take_it_in_their_worker_processes():
    p = glm53ctl("check", "--kind", "toy", "--tp", "1,2", "--rows", "1,4", "-j", "2", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["summary"] == "4 of 4 configs pass"
    assert {k["key"] for k in doc["keys"]} == {f"tiny/toy/tp{t}/r{r}" for t in (1, 2) for r in (1, 4)}
    p = glm53ctl("fault", "--kind", "toy", "--tp", "1", "--rows", "1,4", "-j", "2", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["totals"] == {"sites": 5, "named": 5, "hangs": 0, "retries_equal": 5}


def test_a_kind_without_ranks_is_refused_on_real_ranks():
    """Every in-tree kind runs on real ranks; a kind whose registry line names no rank function is refused with
    --gpus, before any launch (exit 2)."""
    p = glm53ctl("check", "--kind", "toy", "--tp", "2", "--gpus", "2")
    assert p.returncode == 2 and "toy runs on one device only so far" in p.stderr, p.stderr


def test_build_compiles_it(tmp_path):
    p = glm53ctl("build", "-m", "tiny", "--kind", "toy", "--tp", "1", "--rows", "1,4", "-j", "2", "--out", tmp_path)
    assert p.returncode == 0, p.stderr
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [k["key"] for k in manifest["keys"]] == ["tiny/toy/tp1/r1", "tiny/toy/tp1/r4"]
    assert {r["symbol"] for k in manifest["keys"] for r in k["kernels"]} == {"toy_kernel"}


def test_run_saves_its_reference_and_its_launch(tmp_path):
    from safetensors.torch import load_file

    outs = {}
    for backend in ("reference", "triton"):
        out = tmp_path / f"{backend}.safetensors"
        p = glm53ctl("run", "--kind", "toy", "--rows", "4", "--seed", "3", "--backend", backend, "--out", out)
        assert p.returncode == 0, p.stderr
        outs[backend] = load_file(str(out))
    ref, got = outs["reference"], outs["triton"]
    assert set(ref) == set(got) == {"inputs.contexts", "inputs.x", "outputs.y", "outputs.top", "outputs.total"}
    assert (ref["inputs.x"] == got["inputs.x"]).all() and (ref["outputs.y"] == got["outputs.y"]).all()
    assert (ref["outputs.top"] == got["outputs.top"]).all()
    assert (ref["outputs.total"] - got["outputs.total"]).abs().max() < 1e-5


def test_its_tasks_are_a_toy_ops_types_named_in_a_fault(tmp_path):
    """The toy kind schedules a toy op's task types (tests/toy_op/tasks.py, declared as the tree's ops declare
    theirs): its table holds their records' rows, and `fault --list` names its waits by the op's type names."""
    import dataclasses

    from tests.toy_kind.table import build_table
    from tests.toy_op.tasks import Double, Sum

    t = build_table(rows=2, handoff="flag")
    assert t.tasks == [Double(0).row(), Double(1).row(), Sum().row()] and Double(1).row() == (1000, 1, 0, 0)
    assert [f.name for f in dataclasses.fields(Double)] == ["r"] and t.type_name(2) == "toy sum"
    p = glm53ctl("fault", "--kind", "toy", "--tp", "1", "--rows", "2", "--list")
    assert p.returncode == 0, p.stderr
    assert "toy sum <- toy double ×2" in p.stdout, p.stdout
