"""`glm53ctl report --against REF`: the evidence of a kernel change over one set of keys, as a reviewer reads it.

Three parts, each the command itself run in a child process of this tree (`worktree.run_cli`), so the evidence
is the commands' own and a part that fails or dies leaves the others to report: `check --against` (every output
and write bit for bit, with accuracy, invariants and determinism), `build --against` (which code objects change,
registers, spills, shared memory, stack of both trees), and on a GPU `bench --against` (µs per key against REF in
alternating rounds, the ratio with its interval, the verdict against the noise, % of copy; the step's pictures
when `model` is among the kinds). It writes `report.md` (a summary line, a table per part, the command lines, the
environment), `report.json` (the same, with each part's own JSON) and with --html one self-contained page.
"""

from __future__ import annotations

import base64
import html
import json
import platform
import shlex
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl import __version__
from glm53ctl.commands import Command
from glm53ctl.commands.build import parse_list
from glm53ctl.commands.check import ContextOpt, KindOpt, ModelOpt, RowsOpt, TpOpt, tensor_names
from glm53ctl.commands.keys import KernelCacheOpt, context_applies
from glm53ctl.errors import EXIT_USAGE, CheckFailed, UsageError
from glm53ctl.files import check_folder_writable, write_atomic_with
from glm53ctl.interrupts import interrupted
from glm53ctl.kernels.kinds import kernel_kinds, selectable_kinds
from glm53ctl.kernels.spec import ROW_COUNTS, ROWS, TP_WIDTHS, load_model
from glm53ctl.output import err_console, plural
from glm53ctl.pictures import key_label
from glm53ctl.tuning.measure import tree_state
from glm53ctl.worktree import checkout, run_cli, this_tree

PARTS = ("check", "build", "bench")
SCHEMA_VERSION = 1


def register(app: typer.Typer) -> None:
    app.command(name="report", cls=Command)(report)


def report(
    against: Annotated[
        str,
        typer.Option("--against", metavar="REF", help="The git ref (or a tree's folder) the change is judged against."),
    ],
    model: ModelOpt = None,
    kind: KindOpt = None,
    tp: TpOpt = None,
    rows: RowsOpt = None,
    context: ContextOpt = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="DIR", help="Where report.md, report.json (and report.html) go.")
    ] = Path("build/report"),
    parts: Annotated[
        str, typer.Option("--parts", metavar="PART,...", help="Which parts: check, build, bench (default: all).")
    ] = ",".join(PARTS),
    as_html: Annotated[
        bool, typer.Option("--html", help="Also report.html, one page with the pictures inlined.")
    ] = False,
    cache: KernelCacheOpt = None,
    worktrees: Annotated[
        Path, typer.Option("--worktrees", metavar="DIR", help="Where REF's worktree and the builds are kept.")
    ] = Path("build"),
    rounds: Annotated[int, typer.Option("--rounds", min=3, help="A B B A rounds per timed key.")] = 15,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs.")] = 0,
) -> None:
    """The evidence of a kernel change against REF in one document: bits (check), builds (build) and, on a GPU,
    time (bench) over the same keys; report.md for the pull request, report.json, and with --html one page."""

    chosen = parse_list("--parts", parts, PARTS)
    kinds = parse_list("--kind", kind, selectable_kinds(), default=kernel_kinds())
    tps = parse_list("--tp", tp, TP_WIDTHS, int)
    rowss = parse_list("--rows", rows, ROW_COUNTS, int, default=ROWS)
    context_applies(kinds, context is not None)
    if model is not None:
        load_model(model)
    check_folder_writable("--out", out)
    _, ref_sha = checkout(against, worktrees)  # REF refused now, before any part runs; its tree made once
    import torch

    gpu = torch.cuda.is_available()
    model = model or ("glm53_flash" if gpu else "tiny")
    keys = ["--model", model, "--kind", ",".join(kinds), "--tp", ",".join(map(str, tps))]
    keys += ["--rows", ",".join(map(str, rowss))] + (["--context", str(context)] if context is not None else [])
    place = ["--worktrees", str(worktrees)] + (["--cache", str(cache)] if cache is not None else [])
    commands = {
        "check": ["check", "--against", against, *keys, *place, "--seed", str(seed), "--json"],
        # the keys' own launches (what a reviewer reads), REF's built beside them in the same build folder
        "build": ["build", "--against", against, *keys, "--out", str(worktrees), "--no-carry", "--json"],
        "bench": ["bench", "--against", against, *keys, *place, "--rounds", str(rounds), "--seed", str(seed)]
        + (["--save", str(out / "bench")] if "model" in kinds else [])
        + ["--json"],
    }
    results: dict[str, dict] = {}
    doc = {
        "schema": SCHEMA_VERSION,
        "against": {"ref": against, "sha": ref_sha},
        "this": _this(),
        "model": model,
        "keys": {"kinds": kinds, "tp": tps, "rows": rowss, "context": context},
        "summary": "",
        "parts": results,
        "environment": _environment(gpu, torch),
    }
    out.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(chosen, 1):
        if part == "bench" and not gpu:
            err_console.print(f"report: part {i} of {len(chosen)}, bench: skipped (no GPU on this machine)")
            results[part] = {"status": "skipped", "why": "no GPU on this machine", "command": _line(commands[part])}
        else:
            err_console.print(f"report: part {i} of {len(chosen)}, {part}: {_line(commands[part])}")
            try:
                results[part] = _run_part(part, commands[part])
            except KeyboardInterrupt:  # the part's process is stopped with it (worktree.run_cli)
                done = f"{i - 1} of {len(chosen)} parts reported in {out}" if i > 1 else "no part finished"
                raise interrupted(done) from None
            err_console.print(f"report: {part} {results[part]['status']}: {results[part]['summary']}")
        # written after each part: a part that stops the run (a Ctrl-C, a machine's time limit) loses no other
        doc["summary"] = summary(results, against)
        _write_all(doc, out, as_html, last=i == len(chosen))
    sys.stdout.write(doc["summary"] + "\n")
    usage = [p for p, r in results.items() if r.get("exit") == EXIT_USAGE]
    if usage:
        raise UsageError(f"report: {', '.join(usage)} refused its input; the report says why", hint=str(out))
    failed = [p for p, r in results.items() if r["status"] == "failed"]
    if failed:
        raise CheckFailed(f"report: {', '.join(failed)} failed ({doc['summary']}); written to {out}")


def _line(args: list[str]) -> str:
    return "glm53ctl " + shlex.join(args)


def _run_part(part: str, args: list[str]) -> dict:
    """One part: the command in a child process (its progress on stderr as it goes), its JSON and verdict."""
    start = time.monotonic()
    p = run_cli(this_tree(), args)
    res = {"command": _line(args), "exit": p.returncode, "seconds": round(time.monotonic() - start, 1)}
    try:
        res["doc"] = json.loads(p.stdout) if p.stdout.strip() else None
    except json.JSONDecodeError:
        res["doc"] = None
    if res["doc"] is None:  # a crash, a usage error: the part's own stderr above says what
        res |= {"status": "failed", "summary": f"exit {p.returncode}, no results (its error is on stderr)"}
        return res
    res["summary"] = _part_summary(part, res["doc"])
    res["status"] = "passed" if p.returncode == 0 else "failed"
    return res


def _part_summary(part: str, doc: dict) -> str:
    if part == "check":
        keys = doc["keys"]
        differ = [k for k in keys if not k.get("bitwise_equal", True)]
        line = doc["summary"]
        if differ:
            named = "; ".join(f"{k['key']}: {', '.join(tensor_names(k['against']))}" for k in differ)
            line += f"; {len(differ)} of {len(keys)} differ ({named})"
        return line
    if part == "build":
        return doc["summary"]
    timed = [k for k in doc["keys"] if "against" in k]
    verdicts = [k["against"]["verdict"] for k in timed]
    return (
        f"{plural(len(timed), 'keys')} timed against {doc['against']['ref']}: "
        + ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
        if timed
        else "no key timed"
    )


def summary(results: dict, against: str) -> str:
    """The report's first line: each part's verdict, in order."""
    said = []
    for part, r in results.items():
        if r["status"] == "skipped":
            said.append(f"{part} skipped ({r['why']})")
        elif r.get("doc") is None:
            said.append(f"{part} failed ({r['summary']})")
        else:
            said.append(r["summary"])
    return "; ".join(said) if said else f"nothing run against {against}"


def _this() -> dict:
    sha, dirty = tree_state(this_tree())
    return {"sha": sha, "dirty": dirty}


def _environment(gpu: bool, torch) -> dict:
    import triton

    return {
        "glm53ctl": __version__,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "none",
        "gpu": torch.cuda.get_device_name() if gpu else "none (timing skipped; kernels in Triton's interpreter)",
        "host": platform.node(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "glm53ctl " + shlex.join(sys.argv[1:]),
    }


def _write_all(doc: dict, out: Path, as_html: bool, last: bool) -> None:
    """report.json, report.md (and report.html) of the parts so far; named on stderr once all are in."""
    files = {"report.json": json.dumps(doc, indent=2, default=str) + "\n", "report.md": markdown(doc, out)}
    if as_html:
        files["report.html"] = page(doc, out)
    for name, text in files.items():
        write_atomic_with(out / name, lambda tmp, text=text: tmp.write_text(text))
        if last:
            err_console.print(f"wrote {out / name}")


# ---- the document ----------------------------------------------------------------------------------------------


def tables(doc: dict) -> list[tuple[str, list[str], list[list[str]], str]]:
    """Per part: (title, columns, rows, a line under it), the same for markdown and the page."""
    out = []
    ref = doc["against"]["ref"]
    for part, r in doc["parts"].items():
        if r["status"] == "skipped":
            out.append((_TITLES[part], [], [], f"Skipped: {r['why']}."))
            continue
        d = r.get("doc")
        if d is None:
            out.append((_TITLES[part], [], [], f"Failed: {r['summary']}."))
            continue
        cols, rows_ = _PART_TABLES[part](d, ref)
        out.append((_TITLES[part], cols, rows_, r["summary"] + "."))
    return out


def _check_table(d: dict, ref: str):
    cols = ["key", f"bits vs {ref}", "worst output (bound)", "grids, repeats, writes", "result"]
    rows_ = []
    for k in d["keys"]:
        worst = max(k["errors"], key=lambda n: k["errors"][n] / max(k["bounds"].get(n, 1.0), 1e-30), default=None)
        err = f"{worst} {k['errors'][worst]:.1e} ({k['bounds'][worst]:g})" if worst else "—"
        same = all(k.get(f, True) for f in ("grids_equal", "repeats_equal", "schedules_equal"))
        same = same and k["invariants"].get("every output element written", False)
        bits = "equal" if k.get("bitwise_equal") else "differ: " + "; ".join(k.get("against", []))
        ok = "ok" if k["ok"] else "FAIL: " + (k["problems"][0] if k["problems"] else "")
        rows_.append([k["key"], bits, err, "same, all" if same else "differ", ok])
    return cols, rows_


def _pair(v: list) -> str:
    a, b = v
    return f"{a} → {b}" if a != b else f"{a}"


def _build_table(d: dict, ref: str):
    cols = ["key", "status", "kernel", "registers", "spills st/ld", "shared", "stack"]
    rows_ = []
    for r in d["keys"]:
        if r["status"] == "unchanged":
            continue
        for k in r["diff"] or [None]:
            if k is None:
                rows_.append([r["key"], r["status"], "", "", "", "", ""])
                continue
            spills = f"{_pair(k['spill_stores'])} / {_pair(k['spill_loads'])}"
            rows_.append(
                [r["key"], r["status"], k["role"], _pair(k["registers"]), spills, _pair(k["shared"]), _pair(k["stack"])]
            )
    return cols, rows_


def _bench_table(d: dict, ref: str):
    cols = ["key", "µs", f"{ref} µs", "this/ref [95% CI]", "δ", "verdict", "% copy", "floor µs"]
    rows_ = []
    for k in d["keys"]:
        a = k.get("against") or {}
        label = key_label(k)
        ci = a.get("ratio_ci") or [float("nan")] * 2
        rows_.append(
            [
                label,
                f"{k['us']:.1f}",
                f"{a['ref_us']:.1f}" if a else "—",
                f"{a['ratio']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]" if a else "—",
                f"{a['delta']:.4f}" if a else "—",
                a.get("verdict", "—"),
                f"{k['pct_copy']:.1f}" if "pct_copy" in k else "—",
                f"{k['floor_us']:.1f}" if "floor_us" in k else "—",
            ]
        )
    return cols, rows_


_TITLES = {"check": "Bits and accuracy (check)", "build": "Builds (build)", "bench": "Time (bench)"}
_PART_TABLES = {"check": _check_table, "build": _build_table, "bench": _bench_table}


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def markdown(doc: dict, out: Path) -> str:
    """report.md: the summary line first, a table per part, the commands, the environment (paste-ready)."""
    this = doc["this"]
    sha = this["sha"][:12] + (" (with uncommitted changes)" if this["dirty"] else "")
    lines = [
        f"# glm53ctl report: {sha} against {doc['against']['ref']} ({doc['against']['sha'][:12]})",
        "",
        f"**{doc['summary']}**",
        "",
        _scope(doc),
    ]
    for title, cols, rows_, note in tables(doc):
        lines += ["", f"## {title}", "", note]
        if cols and rows_:
            lines += ["", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows_]
        elif cols:
            lines += ["", "No build changes." if title.startswith("Builds") else "No keys."]
    pictures = _pictures(out)
    if pictures:
        lines += ["", "## The step", ""] + [f"![{p.stem}](bench/{p.name})" for p in pictures]
    lines += ["", "## Commands", "", "```"] + [r["command"] for r in doc["parts"].values()] + ["```"]
    lines += ["", "## Environment", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {_md_cell(v)} |" for k, v in doc["environment"].items()]
    return "\n".join(lines) + "\n"


def _scope(doc: dict) -> str:
    k = doc["keys"]
    said = f"Model `{doc['model']}`, kinds {', '.join(k['kinds'])}, TP {', '.join(map(str, k['tp']))}, rows "
    said += ", ".join(map(str, k["rows"])) + (f", context {k['context']}" if k["context"] is not None else "")
    return said + "."


def _pictures(out: Path) -> list[Path]:
    """The step's pictures bench saved beside the report (a `model` key timed)."""
    return sorted((out / "bench").glob("*.svg"))


def page(doc: dict, out: Path) -> str:
    """report.html: one self-contained page (styles inline, the step's pictures inlined as data URIs)."""
    esc = html.escape
    body = [f"<h1>glm53ctl report: {esc(doc['this']['sha'][:12])} against {esc(doc['against']['ref'])}</h1>"]
    body.append(f"<p class=summary>{esc(doc['summary'])}</p>")
    for title, cols, rows_, note in tables(doc):
        body.append(f"<h2>{esc(title)}</h2><p>{esc(note)}</p>")
        if cols and rows_:
            head = "".join(f"<th>{esc(c)}</th>" for c in cols)
            cells = "".join("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows_)
            body.append(f"<table><tr>{head}</tr>{cells}</table>")
    for p in _pictures(out):
        data = base64.b64encode(p.read_bytes()).decode()
        body.append(f"<h2>{esc(p.stem)}</h2><img alt='{esc(p.stem)}' src='data:image/svg+xml;base64,{data}'>")
    body.append("<h2>Commands</h2><pre>" + esc("\n".join(r["command"] for r in doc["parts"].values())) + "</pre>")
    env = "".join(f"<tr><td>{esc(k)}</td><td>{esc(str(v))}</td></tr>" for k, v in doc["environment"].items())
    body.append(f"<h2>Environment</h2><table>{env}</table>")
    style = (
        "body{font:14px system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}.summary{font-weight:bold}"
    )
    return f"<!doctype html><meta charset=utf-8><title>glm53ctl report</title><style>{style}</style>{''.join(body)}\n"
