"""`glm53ctl compare A B`: two saved runs (`glm53ctl run --out`), tensor by tensor, the worst first."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands import Command
from glm53ctl.errors import CheckFailed, UsageError
from glm53ctl.kernels.numerics import bits, rel_rms
from glm53ctl.output import Output, plural


def register(app: typer.Typer) -> None:
    app.command(name="compare", cls=Command)(compare)


RUN_FILE = "pass the .safetensors file `glm53ctl run --out` wrote"


def _check_run_file(path: Path) -> None:
    """A saved run's path, checked before torch loads (seconds): a typo answers at once."""
    if path.is_dir():
        raise UsageError(f"{path}: is a folder, not a saved run", hint=RUN_FILE)
    if not path.is_file():
        raise UsageError(f"{path}: no such file", hint=RUN_FILE)


def _load(path: Path) -> dict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as e:
        raise UsageError(f"{path}: not a safetensors file ({e})", hint=RUN_FILE) from None
    except OSError as e:  # unreadable, or not safetensors where the file system says why (EISDIR and the like)
        raise UsageError(f"{path}: cannot be read as a safetensors file ({e.strerror or e})", hint=RUN_FILE) from None


def compare_tensors(a: dict, b: dict) -> list[dict]:
    """Per tensor name: bitwise equality, B's relative RMS error against A, the largest difference; the worst
    first (missing or mismatched tensors, then NaN, then by relative error)."""
    import torch

    rows = []
    for name in sorted(set(a) | set(b)):
        ta, tb = a.get(name), b.get(name)
        row = {"tensor": name, "equal": False, "rel_rms": None, "max_abs": None, "problem": None}
        if ta is None or tb is None:
            row["problem"] = f"only in {'B' if ta is None else 'A'}"
        elif ta.shape != tb.shape:
            row["problem"] = f"shape {tuple(ta.shape)} vs {tuple(tb.shape)}"
        else:
            if ta.dtype != tb.dtype:  # bits only within a dtype; values across them (fp32 against a bf16 store)
                row["dtypes"] = f"{ta.dtype} vs {tb.dtype}".replace("torch.", "")
            row["equal"] = ta.dtype == tb.dtype and bool(torch.equal(bits(ta), bits(tb)))
            row["rel_rms"], row["max_abs"] = 0.0, 0.0
            if not row["equal"]:
                a64, b64 = ta.double(), tb.double()  # integers too: exact below 2^53
                nan_a, nan_b = torch.isnan(a64), torch.isnan(b64)
                if not torch.equal(nan_a, nan_b):
                    row["problem"] = (
                        f"NaN in one and not the other at {plural(int((nan_a != nan_b).sum()), 'elements')}"
                    )
                finite = ~(nan_a | nan_b)
                if finite.any():
                    row["rel_rms"] = float(rel_rms(a64[finite], b64[finite]))
                    row["max_abs"] = float((a64[finite] - b64[finite]).abs().max())
        rows.append(row)

    def badness(r: dict) -> tuple:
        return (r["problem"] is not None, r["rel_rms"] if r["rel_rms"] is not None else float("inf"))

    return sorted(rows, key=badness, reverse=True)


def compare(
    a: Annotated[Path, typer.Argument(help="The run to compare against (the reference's, say).", metavar="A")],
    b: Annotated[Path, typer.Argument(help="The run to compare (the kernels', say).", metavar="B")],
    bound: Annotated[
        float | None, typer.Option("--bound", help="Exit 1 if a tensor's relative RMS error passes this.")
    ] = None,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="Only the tensors whose names start so, e.g. outputs. (a `run --gpus` file against a one-device "
            "run: its ranks.* are its own).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Every tensor, as JSON on stdout.")] = False,
) -> None:
    """Every tensor of two saved runs: bitwise equal or not, B's relative RMS error against A, the largest
    difference; the worst first."""
    o = Output(as_json)
    if bound is not None and not bound >= 0:  # NaN too: a bound nothing passes is no bound
        raise UsageError(f"--bound {bound:g}: expected a relative RMS error of 0 or more", hint="--bound 1e-2")
    for path in (a, b):
        _check_run_file(path)
    ta, tb = _load(a), _load(b)
    if only is not None:
        prefixes = tuple(p for p in only.split(",") if p)
        ta, tb = ({n: t for n, t in d.items() if n.startswith(prefixes)} for d in (ta, tb))
        if not ta and not tb:
            raise UsageError(f"--only {only}: no tensor of either run starts so", hint="--only outputs.")
    rows = compare_tensors(ta, tb)
    equal = sum(r["equal"] for r in rows)
    summary = f"{equal} of {plural(len(rows), 'tensors')} bitwise equal"
    over = [r for r in rows if r["problem"] or (bound is not None and not r["rel_rms"] <= bound)]
    if over:
        summary += f"; {len(over)} " + (f"over the bound {bound:g} or " if bound is not None else "") + "mismatched"
    o.json({"a": str(a), "b": str(b), "summary": summary, "tensors": rows})
    fmt = lambda v: "" if v is None else f"{v:.2e}"  # noqa: E731
    o.table(
        f"{b} against {a}",
        ["tensor", "bitwise", "rel RMS", "max |diff|", "problem"],
        [
            (
                r["tensor"],
                r.get("dtypes") or ("equal" if r["equal"] else "differs"),
                fmt(r["rel_rms"]),
                fmt(r["max_abs"]),
                r["problem"] or "",
            )
            for r in rows
        ],
    )
    o.text(summary)
    if over:  # a tensor in one run only, of another shape, NaN where the other is not, or past --bound
        raise CheckFailed(summary)
