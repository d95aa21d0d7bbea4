"""Every noinline Triton function has a pinned symbol (kernels/tlx.py `pinned`): Triton names a noinline function by
its module, and ptxas's register allocation moves with the names, so a function moved to another file without a
pin changes its kernel's cubin and its speed (docs/perf/path/2026-12-07-ptx-identity.md)."""

import ast
import importlib
import inspect
from pathlib import Path

import triton

import glm53ctl.kernels

ROOT = Path(glm53ctl.kernels.__file__).parent


def _decorators(fn: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d) for d in fn.decorator_list]


def noinline_functions(root: Path) -> list[tuple[Path, ast.FunctionDef]]:
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and "triton.jit(noinline=True)" in _decorators(node):
                out.append((path, node))
    return out


def unpinned(root: Path) -> list[str]:
    """The noinline functions under root whose decorators do not pin their symbol first."""
    return [
        f"{path.relative_to(root)}:{fn.lineno} {fn.name}"
        for path, fn in noinline_functions(root)
        if not _decorators(fn)[0].startswith("pinned(")
    ]


def test_every_noinline_function_is_pinned():
    functions = noinline_functions(ROOT)
    assert len(functions) >= 20, "the layer kernel's task bodies are found"
    assert not unpinned(ROOT)


def test_no_two_pinned_functions_share_a_symbol():
    """Two noinline functions pinned to one module under one name would be one symbol: Triton would emit the first
    body and call it for both."""
    seen = {}
    for path, fn in noinline_functions(ROOT):
        module = importlib.import_module("glm53ctl.kernels." + ".".join(path.relative_to(ROOT).with_suffix("").parts))
        symbol = (getattr(module, fn.name).__module__, fn.name)
        assert symbol not in seen, (path, seen.get(symbol))
        seen[symbol] = path


def test_an_unpinned_function_is_found(tmp_path):
    (tmp_path / "ops.py").write_text(
        "import triton\n\n\n@triton.jit(noinline=True)\ndef task_moved(x):\n    pass\n"
        "\n\n@pinned(SYMBOLS)\n@triton.jit(noinline=True)\ndef task_kept(x):\n    pass\n"
    )
    assert unpinned(tmp_path) == ["ops.py:5 task_moved"]


def test_the_pin_names_the_symbol():
    """What Triton's code generator mangles (`get_full_name`: the function's `__module__` and name): the pinned
    module, whatever file holds the body (the interpreter's functions carry it too)."""
    module = importlib.import_module("glm53ctl.kernels.ops.dsa.layer")
    assert module.task_select.__module__ == module.SYMBOLS == "glm53ctl.kernels.kinds.layer.mla"
    assert (
        inspect.getsource(triton.runtime.jit.get_full_name)
        .strip()
        .endswith('return f"{fn.__module__}.{fn.__qualname__}"')
    ), "Triton names a function otherwise: pinned() must follow"
