"""The layers hold by contract: pyproject.toml's import-linter contracts, run on this tree, pass; each one fails on a
tree that breaks it; the registry's leaf imports nothing of the project.

The contracts run on a mirror of the tree (a symlink per source file) laid out as the package-dir mapping installs
it (glm53ctl/kernels/, glm53ctl/tuning/): import-linter's graph (grimp) walks a package's folder, and in a checkout
glm53ctl.kernels is kernels/, not glm53ctl/kernels/, so it would see neither it nor glm53ctl.tuning.
"""

import ast
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
    assert "Contracts: 4 kept, 0 broken." in p.stdout, p.stdout
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
    assert "Contracts: 0 kept, 4 broken." in p.stdout, p.stdout
    for said in ("asks_the_kinds -> glm53ctl.kernels.kinds", "prints -> glm53ctl.output", ".loop -> .kernels"):
        assert said in p.stdout, p.stdout


def test_the_layers_and_the_cycles_are_seen_inside_the_kernels(tmp_path):
    """The runtime reaching up into an op (a back-arrow: and, the ops importing the runtime's task types, a cycle),
    and two of the kinds' modules importing each other (a cycle inside kernels/kinds/, and no back-arrow)."""
    p = lint(mirror(tmp_path, {"glm53ctl/kernels/runtime/reads_an_op.py": "import glm53ctl.kernels.ops.gemv.kernel\n"}))
    assert "Contracts: 2 kept, 2 broken." in p.stdout, p.stdout
    assert "glm53ctl.kernels.runtime.reads_an_op -> glm53ctl.kernels.ops.gemv.kernel" in p.stdout, p.stdout
    loop = {
        "glm53ctl/kernels/kinds/dense/loop_a.py": "import glm53ctl.kernels.kinds.sparse.loop_b\n",
        "glm53ctl/kernels/kinds/sparse/loop_b.py": "import glm53ctl.kernels.kinds.dense.loop_a\n",
    }
    p = lint(mirror(tmp_path / "loop", loop))
    assert "Contracts: 3 kept, 1 broken." in p.stdout, p.stdout
    assert "no import cycle" in p.stdout.split("BROKEN")[0].splitlines()[-1], p.stdout


def _function_level_imports(path: Path) -> list[str]:
    """`file:line module` for each import of the project's own modules inside a function of `path`."""
    found = []

    def walk(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.ImportFrom) and (child.module or "").startswith("glm53ctl"):
                found.append(f"{path.relative_to(ROOT)}:{child.lineno} {child.module}")
            if in_function and isinstance(child, ast.Import):
                found.extend(
                    [
                        f"{path.relative_to(ROOT)}:{child.lineno} {a.name}"
                        for a in child.names
                        if a.name.startswith("glm53ctl")
                    ]
                )
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(path.read_text()), False)
    return found


def test_no_module_imports_the_project_inside_a_function():
    """Every import of glm53ctl's own modules is at its module's top, where the import graph (and the contracts
    above) see it: none deferred into a function to dodge a circle. (The CLI loads a command's module by name,
    glm53ctl/cli.py `COMMANDS`, and the registry a kind's harness, kinds/base.py `load`: both by design.)"""
    files = [f for src in PACKAGES.values() for f in (ROOT / src).rglob("*.py")]
    assert len(files) > 100
    found = [hit for f in files for hit in _function_level_imports(f)]
    assert found == []


def test_the_function_level_import_walk_finds_one(tmp_path):
    planted = ROOT / "kernels" / "planted_for_a_test.py"
    try:
        planted.write_text("def f():\n    from glm53ctl.kernels.spec import load_model\n\n    return load_model\n")
        assert _function_level_imports(planted) == ["kernels/planted_for_a_test.py:2 glm53ctl.kernels.spec"]
    finally:
        planted.unlink()


def test_the_registry_is_a_leaf_that_costs_no_torch(tmp_path):
    """Kind, Knob (kinds/base.py) import nothing of the project, the task types only tlx (the interpreter's
    settings); the registry, which reads every kind's facts, loads no torch and no harness."""
    code = (
        "import sys, grimp\n"
        "g = grimp.build_graph('glm53ctl', cache_dir=None)\n"
        "for m in ('glm53ctl.kernels.kinds.base', 'glm53ctl.kernels.runtime.tasks'):\n"
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
        "glm53ctl.kernels.runtime.tasks ['glm53ctl.kernels.tlx']",
        "False False",
    ]
