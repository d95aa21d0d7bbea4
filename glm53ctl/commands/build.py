"""`glm53ctl build`: every kernel per build key, ahead of time for a GPU target, on a machine with no GPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands import Command
from glm53ctl.commands.keys import context_applies, context_of, parse_contexts
from glm53ctl.errors import UsageError
from glm53ctl.files import check_folder_writable, check_replaceable
from glm53ctl.kernels.build import build as run_build
from glm53ctl.kernels.build import compare, fill_sass, for_build, parse_target
from glm53ctl.kernels.checks import other_schedule
from glm53ctl.kernels.kinds import get_kind, kernel_kinds, load_harness, selectable_kinds
from glm53ctl.kernels.sizes import check_positions
from glm53ctl.kernels.spec import ROW_COUNTS, ROWS, TP_WIDTHS, load_model, model_names
from glm53ctl.output import Output, Progress, err_console, plural, print_warning
from glm53ctl.tuning.knobs import defaults, kind_knobs, resolve_key
from glm53ctl.worktree import checkout, run_cli


def parse_list(flag: str, text: str | None, allowed: tuple, cast=str, default: tuple | None = None) -> list:
    """A comma-separated option's values, each one of `allowed`; none given: `default` (else all of allowed)."""
    if text is None:
        return list(allowed if default is None else default)
    try:
        values = [cast(v.strip()) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(
            f"{flag} {text!r}: expected a comma-separated list of {', '.join(map(str, allowed))}"
        ) from None
    bad = [v for v in values if v not in allowed]
    if bad or not values:
        raise UsageError(f"{flag} {text!r}: expected values from {', '.join(map(str, allowed))}")
    return values


def register(app: typer.Typer) -> None:
    app.command(name="build", cls=Command)(build)


def build(
    model: Annotated[str | None, typer.Option("--model", "-m", help="Models, comma-separated (default: all).")] = None,
    kind: Annotated[str | None, typer.Option("--kind", "-k", help="Kinds (default: every kind with kernels).")] = None,
    tp: Annotated[str | None, typer.Option("--tp", help="TP widths, e.g. 4,8 (default: 1,2,4,8).")] = None,
    rows: Annotated[str | None, typer.Option("--rows", help="Rows, e.g. 1,2 (default: 1,2,4,8).")] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            metavar="N,...",
            help="Tokens cached before the step, for the kinds that read caches (sparse, model): build the keys "
            "that check, bench and run at that --context will launch (default: the check's contexts).",
        ),
    ] = None,
    target: Annotated[str, typer.Option("--target", help="GPU target.")] = "sm_90",
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="Compiler processes.")] = max(1, (os.cpu_count() or 2)),
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="DIR", help="Build folder: manifest.json, cache/, worktrees/.")
    ] = Path("build"),
    against: Annotated[
        str | None, typer.Option("--against", metavar="REF", help="A git ref: which builds change.")
    ] = None,
    carry: Annotated[
        bool,
        typer.Option(
            "--carry/--no-carry",
            help="Also build what check, bench and run launch of each key besides its own launches (its other "
            "schedule and grids, the separate-launch baselines, a step's other chain), for the kernel cache; "
            "--no-carry: the keys' own launches only.",
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="The manifest (or comparison) as JSON.")] = False,
) -> None:
    """Compile every kernel per build key ahead of time; registers, spills, shared memory, stack, code hash. Every
    kernel goes into the kernel cache DIR/kernels, which `--cache` loads on a GPU machine of the same target."""

    o = Output(as_json)
    arch = parse_target(target)
    if out.exists() and not out.is_dir():
        raise UsageError(
            f"--out {out}: is a file; the build folder holds manifest.json and its cache",
            hint="pass --out DIR, a folder (made if absent)",
        )
    # before any compiling: the build folder (default build/ in the working folder) must take files
    check_folder_writable("--out", out)
    check_folder_writable("--out", out / "cache")
    if (out / "manifest.json").exists():
        check_replaceable("--out", out / "manifest.json")
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: expected at least 1")
    # a model by name or by the path of its .toml; every one must load
    models = [m.strip() for m in model.split(",")] if model else model_names()
    for m in models:
        load_model(m)
    kinds = parse_list("--kind", kind, selectable_kinds(), default=kernel_kinds())
    tps = parse_list("--tp", tp, TP_WIDTHS, int)
    rowss = parse_list("--rows", rows, ROW_COUNTS, int, default=ROWS)

    readers = context_applies(kinds, context is not None)
    contexts = parse_contexts(context) if context is not None else [None]
    for m in models:
        for c in contexts:
            if c is not None:
                check_positions(load_model(m), c)
    # each key resolved once, for no device (a build's grid: `for_build`); no GPU, so no lookup warns
    keys = list(
        dict.fromkeys(
            for_build(resolve_key(m, k, t, r, None, None, context_of(k, c) if k in readers else None))
            for m in models
            for k in kinds
            for t in tps
            for r in rowss
            for c in contexts
        )
    )
    variants = {k: carried_variants(k) for k in keys} if carry else {}
    theirs = None
    if against is not None:
        tree, sha = checkout(against, out)
        o.log(f"building {against} ({sha[:12]}) in {tree}")
        args = [
            "build",
            "--json",
            "--target",
            target,
            "-j",
            str(jobs),
            "--out",
            str((out / "ref" / sha[:12]).resolve()),
        ]
        for flag, value in (
            ("--model", model),
            ("--kind", kind),
            ("--tp", tp),
            ("--rows", rows),
            ("--context", context),
        ):
            if value is not None:
                args += [flag, value]
        p = run_cli(tree, args)
        if p.returncode:
            raise UsageError(f"building {against} failed (exit {p.returncode})", hint="its error is above")
        theirs = json.loads(p.stdout)
        fill_sass(theirs, out / "ref" / sha[:12] / "kernels")
    o.log(f"building {plural(len(keys), 'keys')} for {target} with {plural(jobs, 'processes', 'process')}")
    progress = Progress(len(keys))  # on stderr, --json or not: stdout carries the manifest alone
    try:
        manifest = run_build(
            keys,
            arch,
            out,
            jobs,
            progress=lambda k: err_console.print(progress.line(f"built {k.name}")),
            variants=variants,
        )
    except OSError as e:  # what the checks above cannot foresee (a full disk, a folder made read-only since)
        if e.filename is None or not Path(e.filename).absolute().is_relative_to(out.absolute()):
            raise
        raise UsageError(
            f"--out {out}: cannot write {e.filename} ({e.strerror})", hint="pass --out DIR where you may write"
        ) from None
    if theirs is None:
        o.json(manifest)
        _table(o, manifest)
        return

    rows_ = compare(manifest, theirs)
    changed = sum(r["status"] != "unchanged" for r in rows_)
    summary = f"{changed} of {plural(len(rows_), 'builds')} {'changes' if changed == 1 else 'change'} against {against}"
    said = {
        "renamed": "only renamed: the same machine code but for its functions' names",
        # ptxas's choices follow the functions' names: the code is REF's, the speed need not be
        "reallocated": "reallocated: the same PTX but for its functions' names, other machine code",
    }
    notes = [f"{n} {said[s]}" for s in said if (n := sum(r["status"] == s for r in rows_))]
    if notes:
        summary += f" ({'; '.join(notes)})"
    o.json({"against": against, "summary": summary, "keys": rows_, "manifest": manifest})
    _table(o, manifest)
    o.table(
        f"against {against}",
        ["key", "status", "kernel", "registers", "spills st/ld", "shared", "stack"],
        [
            (
                r["key"],
                r["status"],
                d["role"],
                _pair(d["registers"]),
                f"{_pair(d['spill_stores'])} / {_pair(d['spill_loads'])}",
                _pair(d["shared"]),
                _pair(d["stack"]),
            )
            for r in rows_
            if r["status"] != "unchanged"
            for d in (
                r["diff"]
                or [
                    {
                        "role": "",
                        **{f: [None, None] for f in ("registers", "spill_stores", "spill_loads", "shared", "stack")},
                    }
                ]
            )
        ],
    )
    o.text(summary)


def carried_variants(key) -> list[tuple[str, object]]:
    """What the commands launch of a key on a GPU besides its own launches, each as (name, resolved key): `check`
    its other schedule (knob `launch`) and its other grids, `bench` its baselines of this project's kernels
    (`separate`, `separate-pdl`, `defaults`; a step's other `chain`). A tune's trials are not known ahead: they
    compile there."""

    harness, knobs = load_harness(key.kind), key.knobs
    out = []
    if (other := other_schedule(key)) is not None:
        out.append((f"launch={other}", key.with_knobs({"launch": other})))
    if get_kind(key.kind).composite:
        out += [
            (f"chain={c}", key.with_knobs({"chain": c}))
            for c in kind_knobs(key.kind)["chain"].values
            if c != knobs.chain
        ]
    else:
        out += [(f"grid={g}", key.with_knobs({"grid": g})) for g in harness.CHECK_GRIDS if g != knobs.grid]
        if harness.STAGES:
            whole = key.with_knobs({"launch": "persistent"}) if "launch" in knobs else key
            out += [("separate", whole), ("separate-pdl", whole)]
    if (d := for_build(key.with_knobs(defaults(key.kind)))).knobs != knobs:
        out.append(("defaults", d))
    return out


def _pair(v: list) -> str:
    a, b = v
    return str(b) if a == b else f"{a} → {b}"


def _table(o: Output, manifest: dict) -> None:
    rows = [
        (
            e["key"],
            k["role"],
            k["symbol"],
            k["registers"],
            f"{k['spill_stores']}/{k['spill_loads']}",
            k["shared"],
            k["stack"],
            k["hash"],
            "cached" if k["cached"] else f"{k['compile_s']:.2f}",
        )
        for e in manifest["keys"]
        for k in e["kernels"]
    ]
    o.table(
        f"{manifest['target']} builds (Triton {manifest['triton']})",
        ["key", "kernel", "symbol", "registers", "spills st/ld B", "shared B", "stack B", "code hash", "compile s"],
        rows,
    )
    t = manifest["totals"]
    o.text(
        f"{plural(t['keys'], 'keys')}, {plural(t['kernels'], 'kernels')}, "
        f"{plural(t['distinct_symbols'], 'distinct code objects')}; "
        f"{t['compiled']} compiled in {t['compile_s']:.1f} s of compiler time ({manifest['seconds']:.1f} s wall), "
        f"max {plural(t['max_registers'], 'registers')}, {plural(t['spill_bytes'], 'spill bytes')}"
    )
    o.text(
        f"kernel cache {manifest['kernel_cache']}: {plural(t['carried'], 'kernels')}, the keys' own and what check, "
        "bench and run launch of them besides (--cache DIR loads them on a GPU)"
    )
    failed = {}
    for e in manifest["keys"]:
        for c in e["carried"]:
            if "error" in c:
                failed.setdefault((c["variant"], c["error"]), []).append(e["key"])
    for (variant, error), keys in failed.items():  # a baseline this model's sizes cannot build: compiled there, fails
        print_warning(f"{variant} of {', '.join(dict.fromkeys(keys))} did not compile: {error}")
