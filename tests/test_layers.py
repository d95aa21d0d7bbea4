"""The layers hold by contract: pyproject.toml's import-linter contracts, run on this tree, pass; each one fails on a
tree that breaks it; the registry's leaf imports nothing of the project.

The contracts run on a mirror of the tree (a symlink per source file) laid out as the package-dir mapping installs
it (glm53ctl/kernels/, glm53ctl/tuning/): import-linter's graph (grimp) walks a package's folder, and in a checkout
glm53ctl.kernels is kernels/, not glm53ctl/kernels/, so it would see neither it nor glm53ctl.tuning.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
# where each import package's files are (pyproject.toml's package-dir)
PACKAGES = {"glm53ctl": "glm53ctl", "glm53ctl/kernels": "kernels", "glm53ctl/tuning": "tuning"}

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the test extra)")


def mirror(at: Path, extra: dict[str, str] | None = None) -> Path:
    """The tree's Python files under `at` as installed (a symlink each), plus `extra` (path -> source)."""
    for dest, src in PACKAGES.items():
        for f in (ROOT / src).rglob("*.py"):
            link = at / dest / f.relative_to(ROOT / src)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(f)
    for path, text in (extra or {}).items():
        (at / path).write_text(text)
    return at


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_import_contracts_hold(tmp_path):
    p = lint(mirror(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Contracts: 3 kept, 0 broken." in p.stdout, p.stdout
    # the graph saw the subpackages (a contract on a module it does not know is an error, not a pass)
    assert "glm53ctl.kernels.runtime" not in p.stderr


def test_each_contract_fails_on_a_tree_that_breaks_it(tmp_path):
    broken = {
        # an op that asks the registry: an import up into the kinds
        "glm53ctl/kernels/ops/gemv/asks_the_kinds.py": "from glm53ctl.kernels.kinds import KINDS\n",
        # the library printing through the CLI's output module
        "glm53ctl/tuning/prints.py": "from glm53ctl.output import print_warning\n",
        # a cycle between two of glm53ctl's modules: glm53ctl.loop -> glm53ctl.kernels -> glm53ctl.loop
        "glm53ctl/loop.py": "import glm53ctl.kernels.spec\n",
        "glm53ctl/kernels/loop_back.py": "import glm53ctl.loop\n",
    }
    p = lint(mirror(tmp_path, broken))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Contracts: 0 kept, 3 broken." in p.stdout, p.stdout
    for said in ("asks_the_kinds -> glm53ctl.kernels.kinds", "prints -> glm53ctl.output", ".loop -> .kernels"):
        assert said in p.stdout, p.stdout


def test_the_registry_is_a_leaf_that_costs_no_torch(tmp_path):
    """Kind, Knob (kinds/base.py) and the task types import nothing of the project; the registry, which reads every
    kind's facts, loads no torch and no harness."""
    code = (
        "import sys, grimp\n"
        "g = grimp.build_graph('glm53ctl', cache_dir=None)\n"
        "for m in ('glm53ctl.kernels.kinds.base', 'glm53ctl.kernels.kinds.task_types'):\n"
        "    print(m, sorted(g.find_modules_directly_imported_by(m)))\n"
        "import glm53ctl.kernels.kinds\n"
        "print('torch' in sys.modules, any(m.endswith('.harness') for m in sys.modules))\n"
    )
    tree = mirror(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "glm53ctl.kernels.kinds.base []",
        "glm53ctl.kernels.kinds.task_types []",
        "False False",
    ]
