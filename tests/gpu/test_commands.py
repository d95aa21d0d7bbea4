"""The GPU tier of the commands themselves, as a user runs them (the other GPU tests call library functions):
`tune --write` into a config folder of its own and `--search-only`, `bench --save --markdown`, and `bench --against`
a tree that is faster than this one (here: this tree against a copy of it slowed on purpose) exiting 1."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm53ctl import tuned
from glm53ctl.paths import config_root
from glm53ctl.worktree import finder_code, this_tree

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the GPU tier runs compiled kernels"),
]
KEY = ("--kind", "tail", "--tp", "2", "--rows", "2")


def glm53ctl(*args, tree: Path | None = None, env: dict | None = None, timeout: int = 900):
    """The CLI in a process of its own, from `tree` (default: this one) whatever is installed."""
    boot = finder_code(tree or this_tree()) + "\nfrom glm53ctl.cli import main\nmain()\n"
    cmd = [sys.executable, "-c", boot, *map(str, args)]
    env = os.environ | {"TRITON_INTERPRET": "0"} | (env or {})
    return subprocess.run(cmd, cwd=tree or this_tree(), env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def config_dir(tmp_path):
    shutil.copytree(config_root() / "models", tmp_path / "config" / "models")
    return tmp_path / "config"


def test_tune_write_and_search_only(config_dir, tmp_path):
    env = {"GLM53CTL_CONFIG_DIR": str(config_dir)}
    store = f"sqlite:///{tmp_path / 'studies.db'}"
    search = ["--space", "gathers,handoff", "--trials", "4", "--storage", store]
    p = glm53ctl("tune", *KEY, *search, "--search-only", env=env)
    assert p.returncode == 0, p.stderr
    assert not (config_dir / "tuned").exists()  # a worker writes nothing
    p = glm53ctl("tune", *KEY, *search, "--rounds", "5", "--write", "--json", env=env)
    assert p.returncode == 0, p.stderr
    path = config_dir / "tuned" / "glm53_flash" / "tp2.json"
    assert f"wrote {path}" in p.stderr
    cfg = tuned.load(path)
    entry = cfg.entry("tail", 2)
    doc = json.loads(p.stdout)
    (res,) = doc["keys"]
    assert res["trials"]["complete"] + res["trials"]["same_launch"] + res["trials"]["rejected"] == 4
    assert entry.knobs == res["kept"] and cfg.revision == 1 and "--write" in cfg.provenance.command
    assert glm53ctl("configs", "validate", path).returncode == 0


def test_bench_save_and_markdown(tmp_path):
    p = glm53ctl("bench", *KEY, "--rounds", "5", "--save", tmp_path / "saved", "--markdown")
    assert p.returncode == 0, p.stderr
    (saved,) = (tmp_path / "saved").glob("*.json")
    row = json.loads(saved.read_text())["keys"][0]
    assert row["us"] > 0 and row["pct_copy"] > 0
    table = [line for line in p.stdout.splitlines() if line.startswith("|")]
    assert len(table) >= 3 and table[2].startswith("| tail TP2 r2 |"), p.stdout


SLOW = """
    for _ in range(64):  # planted by tests/gpu/test_commands.py: about 64 µs a program
        _nanosleep(tl.arange(0, 32), 1000)
"""


def test_bench_against_a_faster_tree_exits_1(tmp_path):
    """A copy of this tree whose tail kernel sleeps in every program is timed against this tree (a folder
    holding a tree): this tree is faster beyond the noise, so the slowed one exits 1 and says so."""
    slow = tmp_path / "slow"
    shutil.copytree(this_tree(), slow, ignore=shutil.ignore_patterns(".git", "build", ".venv", ".whl", "*.egg-info"))
    kernel = slow / "kernels" / "kinds" / "tail" / "kernel.py"
    text = kernel.read_text()
    anchor = "    epoch = launch_epoch(ctl, INTERPRET)\n"
    assert text.count(anchor) == 1
    text = text.replace(anchor, anchor + SLOW)
    text = text.replace(
        "from glm53ctl.kernels.runtime.device import (",
        "from glm53ctl.kernels.runtime.device import (\n    _nanosleep,",
    )
    kernel.write_text(text)
    p = glm53ctl("bench", *KEY, "--rounds", "5", "--against", this_tree(), "--worktrees", tmp_path / "wt", tree=slow)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "faster" in p.stdout + p.stderr


def test_report_against_a_faster_tree_times_it_and_exits_1(tmp_path):
    """`report` on a GPU: the slowed copy of this tree against this tree, bench part only: its table says REF is
    faster (verdict `slower` for this tree), report.md and report.json carry it, exit 1."""
    slow = tmp_path / "slow"
    shutil.copytree(this_tree(), slow, ignore=shutil.ignore_patterns(".git", "build", ".venv", ".whl", "*.egg-info"))
    kernel = slow / "kernels" / "kinds" / "tail" / "kernel.py"
    anchor = "    epoch = launch_epoch(ctl, INTERPRET)\n"
    text = kernel.read_text().replace(anchor, anchor + SLOW)
    text = text.replace(
        "from glm53ctl.kernels.runtime.device import (",
        "from glm53ctl.kernels.runtime.device import (\n    _nanosleep,",
    )
    kernel.write_text(text)
    out = tmp_path / "report"
    args = ["report", "--against", this_tree(), *KEY, "--parts", "bench", "--rounds", "5", "--out", out, "--html"]
    p = glm53ctl(*args, "--worktrees", tmp_path / "wt", tree=slow)
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads((out / "report.json").read_text())
    (row,) = doc["parts"]["bench"]["doc"]["keys"]
    assert row["against"]["verdict"] == "slower" and "1 slower" in doc["summary"]
    assert "| tail TP2 r2 |" in (out / "report.md").read_text() and (out / "report.html").exists()


def test_bench_perfetto_and_op(tmp_path):
    """`bench --trace --perfetto FILE` writes the traced launch as a Chrome trace; `bench --op` times each op."""
    trace = tmp_path / "t.json"
    p = glm53ctl("bench", *KEY, "--rounds", "5", "--trace", "--perfetto", trace)
    assert p.returncode == 0, p.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(ev["ph"] == "X" and ev["cat"] == "critical" for ev in events)
    p = glm53ctl("bench", "--op", "select,route", "--sizes", "1,4", "--rounds", "5", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)["ops"]
    assert [(r["op"], r["size"]) for r in rows] == [("select", 1), ("select", 4), ("route", 1), ("route", 4)]
    assert all(r["us"] > 0 for r in rows)
