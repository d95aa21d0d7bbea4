"""`glm53ctl bench`: µs per launch against the copy-bandwidth floor, beside baselines and another git ref
(docs/design.md §8; tuning/bench.py measures)."""

from __future__ import annotations

import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands import Command
from glm53ctl.commands.build import parse_list
from glm53ctl.commands.keys import (
    KernelCacheOpt,
    context_applies,
    context_fits,
    parse_contexts,
    print_kernels,
    ranks_width,
    refuse_step_baselines,
    use_kernel_cache,
)
from glm53ctl.errors import CheckFailed, UsageError
from glm53ctl.files import check_replaceable, write_atomic_with
from glm53ctl.kernels import kernel_cache
from glm53ctl.kernels.checks import key_seed
from glm53ctl.kernels.kernel_cache import open_cache
from glm53ctl.kernels.kinds import kernel_kinds, load_ranks, selectable_kinds
from glm53ctl.kernels.runtime.ranks import RankLayout
from glm53ctl.kernels.runtime.trace import format_summary
from glm53ctl.kernels.spec import ROW_COUNTS, ROWS, TP_WIDTHS, load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.output import Output, Progress, err_console, plural, print_warning
from glm53ctl.pictures import key_label, matrix_picture, saved_steps, step_picture
from glm53ctl.tuning import measure
from glm53ctl.tuning.ab import against
from glm53ctl.tuning.bench import compile_workers, environment_ok, free_for_workers, precompile, time_key
from glm53ctl.tuning.knobs import check_knobs, defaults, parse_knobs, resolve_key
from glm53ctl.tuning.ops_bench import OPS, time_op
from glm53ctl.worktree import checkout, repo_root, resolve, this_tree

BASELINES = ("separate", "separate-pdl", "torch", "compile", "defaults", "persistent", "stages", "chain")


def register(app: typer.Typer) -> None:
    app.command(name="bench", cls=Command)(bench)


def bench(
    model: Annotated[str, typer.Option("--model", "-m", help="Model.")] = "glm53_flash",
    kind: Annotated[str | None, typer.Option("--kind", "-k", help="Kinds (default: every kind with kernels).")] = None,
    tp: Annotated[str | None, typer.Option("--tp", help="TP widths, e.g. 4,8 (default: 1,2,4,8).")] = None,
    rows: Annotated[str | None, typer.Option("--rows", help="Rows, e.g. 1,8 (default: 1,2,4,8).")] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context",
            metavar="N,...",
            help="Tokens cached before the step, e.g. 4096,32768 (row r: r*3 fewer), for the kinds that read "
            "caches (sparse); default: the check's contexts, below and above the selection width.",
        ),
    ] = None,
    knobs: Annotated[
        str | None,
        typer.Option("--knobs", metavar="K=V,...", help="Time this knob set (over the tuned file and defaults)."),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="B,...",
            help="Timed beside the launch in alternating rounds: separate (one launch per stage), separate-pdl "
            "(the same chained by programmatic dependent launch), torch (stock ops in bf16, CUDA graph), compile "
            "(torch.compile, CUDA graph), defaults (the registry's knobs, not the tuned file's), persistent or "
            "stages (the key in that schedule, knob launch; its bits checked first), chain (a step: its launches "
            "under the other value of knob chain).",
        ),
    ] = None,
    against: Annotated[
        str | None,
        typer.Option("--against", metavar="REF", help="A git ref (or a tree's folder): its launches, A B B A."),
    ] = None,
    worktrees: Annotated[
        Path, typer.Option("--worktrees", metavar="DIR", help="Where --against keeps worktrees.")
    ] = Path("build"),
    cache: KernelCacheOpt = None,
    trace: Annotated[
        bool, typer.Option("--trace", help="Where a launch's time goes: task types, stages, path.")
    ] = False,
    op: Annotated[
        str | None,
        typer.Option(
            "--op",
            metavar="OP,...",
            help="Time an op's body alone instead of launches: select (the top-k over --sizes pools), select3 .. "
            "select0 (with 3 .. 0 radix passes as launches: knob select_passes), route (the "
            "routing of --sizes rows), kda_head (the KDA core of --sizes heads), gate (the mHC gate of --sizes "
            "rows), scores (the index scores of --sizes pools), mla_attention (the sparse MLA of --sizes heads); its "
            "plain launches in a CUDA graph.",
        ),
    ] = None,
    sizes: Annotated[
        str | None, typer.Option("--sizes", metavar="N,...", help="With --op: its sizes (default: the op's own).")
    ] = None,
    perfetto: Annotated[
        Path | None,
        typer.Option(
            "--perfetto",
            metavar="FILE",
            help="With --trace: every traced launch as a Chrome trace (a track per program, a slice per task's wait "
            "and work, the critical path marked), which the Perfetto UI opens.",
        ),
    ] = None,
    rounds: Annotated[int, typer.Option("--rounds", min=3, help="Graph replays (and A B B A rounds) per figure.")] = 15,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs.")] = 0,
    save: Annotated[
        Path | None, typer.Option("--save", metavar="DIR", help="Write the raw JSON, with the environment, here.")
    ] = None,
    jobs_: Annotated[
        int, typer.Option("--jobs", "-j", help="Processes compiling the keys first (default: the cores but two).")
    ] = 0,
    gpus: Annotated[
        int,
        typer.Option(
            "--gpus",
            min=1,
            help="Real ranks: T times each key at TP T on T GPUs, one process per rank, beside the one-device "
            "emulation (1, the default: the emulation alone).",
        ),
    ] = 1,
    compile_only: Annotated[bool, typer.Option("--compile-only", hidden=True)] = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="A markdown table on stdout (for a pull request).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Results as JSON on stdout.")] = False,
) -> None:
    """Time launches: µs per launch, bytes moved, the floor at the copy bandwidth and % of it; beside baselines
    and another git ref. Needs a GPU. Exits 1 when --against REF is faster beyond the noise."""

    if as_json and markdown:
        raise UsageError("--json and --markdown: choose one")
    if op is not None or sizes is not None:
        _bench_ops(op, sizes, model, rounds, save, as_json, markdown, kind, against, trace, baseline)
        return
    if gpus > 1:
        tp = _real_ranks(gpus, kind, tp, against, trace)
    kinds = parse_list("--kind", kind, selectable_kinds(), default=kernel_kinds())
    tps = parse_list("--tp", tp, TP_WIDTHS, int)
    rowss = parse_list("--rows", rows, ROW_COUNTS, int, default=ROWS)
    baselines = parse_list("--baseline", baseline, BASELINES) if baseline is not None else []
    refuse_step_baselines(kinds, baselines)
    contexts = _contexts(context, kinds)
    spec = load_model(model)
    for t in tps:
        spec.check_tp(t)
    readers = sorted({c for cs in contexts.values() for c in cs})
    context_fits(spec, list(contexts), rowss, readers)  # positions, before the GPU is looked for
    overrides = {k: parse_knobs(knobs, k) for k in kinds}
    for k, v in overrides.items():
        check_knobs(k, v)
    if save is not None and save.exists() and not save.is_dir():
        raise UsageError(f"--save {save}: not a folder")
    if perfetto is not None:
        if not trace:
            raise UsageError("--perfetto FILE writes the traced launches: give --trace too")
        check_replaceable("--perfetto", perfetto)
    command = "glm53ctl " + shlex.join(sys.argv[1:])  # as typed, whether run as glm53ctl or python -m glm53ctl
    ref_sha = _resolve_ref(against) if against is not None else None

    if cache is not None:
        open_cache(cache)

    environment_ok()  # exit 2 without a GPU, before anything is built
    use_kernel_cache(cache)

    with kernel_cache.tallied() as compiles:  # every key's compiles and loads, this process's and its workers'
        if gpus > 1:
            RankLayout(gpus, gpus, "cuda")  # exit 2 with fewer GPUs than ranks
        context_fits(spec, list(contexts), rowss, readers, "cuda")  # memory, before a cache is made

        ref_tree = _checkout(against, worktrees) if against is not None else None
        err_console.print(f"bench {model}: warming clocks, measuring the copy bandwidth")
        measure.warm_clocks()
        bw = measure.copy_bandwidth()
        err_console.print(f"  copy bandwidth {bw:.3f} TB/s")
        weights = Weights(spec, seed=0, device="cuda")

        keys = []  # each resolved once (its overrides over the tuned file), what its lookup said printed once
        for k in kinds:
            for t, r, c in [(t, r, c) for t in tps for r in rowss for c in contexts.get(k, [None])]:
                keys.append(key := resolve_key(model, k, t, r, overrides[k], "cuda", c, context_warned=True))
                for w in key.warnings:
                    print_warning(w)
        jobs = []
        for key in keys:
            jobs.append((key, tuple(baselines)))
            if "defaults" in baselines and (d := key.with_knobs(defaults(key.kind))).knobs != key.knobs:
                jobs.append((d, ()))
        if cache is None:  # a carried cache loads in this process, faster than workers start
            precompile(jobs, jobs_ or compile_workers(), err_console.print)
        if compile_only:
            return
        progress = Progress(len(keys))
        results = []
        for key in keys:
            k, t, r, c = key.kind, key.tp, key.rows, key.context
            with kernel_cache.counting(key.name):
                row = time_key(
                    weights, key, baselines, rounds, seed, bw, trace, on_ranks=gpus > 1, log=err_console.print
                )
            if ref_tree is not None:
                s = key_seed(seed, key.name)
                free_for_workers(weights)  # the two trees' workers each hold a key's weights: on an 80 GB card,
                # kda's beside this process's own did not fit (H100, 2026-12-07)
                row["against"] = _against(this_tree(), ref_tree, model, k, t, r, overrides[k], s, rounds, c)
            results.append(row)
            err_console.print(progress.line(_summary_line(row)))
        counts = compiles()
        for row, key in zip(results, keys, strict=True):
            row["kernels"] = counts.get(key.name, kernel_cache.Counts()).as_dict()
        if perfetto is not None:  # taken out of the rows before they are printed or saved
            chrome = perfetto_trace(results)
            write_atomic_with(perfetto, lambda tmp: tmp.write_text(json.dumps(chrome) + "\n"))
            err_console.print(f"saved {perfetto} ({len(chrome['traceEvents']):,} events; open it in ui.perfetto.dev)")
        for r in results:
            (r.get("trace") or {}).pop("perfetto", None)
        env = measure.environment(command)
        doc = {
            "environment": env,
            "code_digest": measure.code_digest(),
            "model": model,
            "copy_tb_s": bw,
            "rounds": rounds,
            "against": {"ref": against, "sha": ref_sha} if against else None,
            "kernel_cache": str(cache) if cache is not None else None,
            "keys": results,
        }
        if save is not None:
            _save(save, doc)
        o = Output(as_json)
        o.json(doc)
        if markdown:
            sys.stdout.write(to_markdown(doc))
        else:
            cols, table = _table(results, against)
            o.table(f"bench {model} on {env['gpu_name']} (copy {bw:.2f} TB/s)", cols, table)
            print_kernels(o, counts)
            if not as_json:
                for r in results:
                    if "parts" in r:
                        sys.stdout.write("\n" + format_step(r))
        if trace and not as_json:
            for r in results:
                if r["trace"] is None:
                    sys.stdout.write(f"\n{r['kind']}: no traced build of this kind yet\n")
                    continue
                if "by_kind" in r["trace"]:  # a step: which kind and which stage hold it
                    sys.stdout.write(f"\n{key_label(r)}: traced step\n" + format_step_trace(r["trace"]) + "\n")
                    continue
                sys.stdout.write(f"\n{key_label(r)}: traced launch\n" + format_trace(r["trace"]) + "\n")
        slower = [r for r in results if r.get("against", {}).get("verdict") == "slower"]
        if slower:
            names = ", ".join(key_label(r) for r in slower)
            of = plural(len(results), "keys")
            raise CheckFailed(f"{against} is faster beyond the noise at {len(slower)} of {of}: {names}")


def perfetto_trace(rows: list[dict]) -> dict:
    """Every traced key's launch (a step's parts) in one Chrome trace, a key's launches as processes named by
    the key (`bench --perfetto FILE`), taken out of the rows (their JSON stays the size it was)."""
    events = []
    for i, r in enumerate(rows):
        for ev in (r.get("trace") or {}).pop("perfetto", []):
            pid = (i + 1) * 1000 + ev["pid"]
            ev = ev | {"pid": pid} | ({"id": pid * 1_000_000 + ev["id"] % 1_000_000} if "id" in ev else {})
            if ev["ph"] == "M" and ev["name"] == "process_name":
                ev["args"] = {"name": f"{key_label(r)}: {ev['args']['name']}"}
            events.append(ev)
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def _bench_ops(op, sizes, model, rounds, save, as_json, markdown, kind, against, trace, baseline) -> None:
    """`bench --op`: each op's body alone at each size (tuning/ops_bench.py), µs per call."""
    if op is None:
        raise UsageError("--sizes: the sizes of an --op", hint=f"--op {','.join(OPS)} --sizes 1024,4096")
    given = [n for n, v in (("--kind", kind), ("--against", against), ("--baseline", baseline)) if v is not None]
    if given or trace or markdown:
        raise UsageError(f"--op times an op's body alone: no {', '.join(given) or '--trace or --markdown'} with it")
    names = parse_list("--op", op, tuple(OPS))
    if sizes is not None:
        try:
            values = [int(v) for v in sizes.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values or min(values) < 1:
            raise UsageError(f"--sizes {sizes!r}: expected a comma-separated list of counts, 1 or more")
        for name in names:  # the launches hold at most `most` (the routing's and the gate's rows, one program's pools)
            most = OPS[name].most
            if most is not None and max(values) > most:
                what = "the routing's" if name == "route" else f"{name}'s"
                raise UsageError(f"--sizes {sizes!r}: {what} sizes are {OPS[name].unit}, 1 to {most}")
    if save is not None and save.exists() and not save.is_dir():
        raise UsageError(f"--save {save}: not a folder")
    spec = load_model(model)
    command = "glm53ctl " + shlex.join(sys.argv[1:])
    environment_ok()  # exit 2 without a GPU
    measure.warm_clocks()
    rows = []
    for name in names:
        for size in values if sizes is not None else OPS[name].sizes:
            row = time_op(name, spec, size, rounds)
            rows.append(row)
            err_console.print(f"{name} at {size} {OPS[name].unit}: {row['us']:.2f} us")
    doc = {"environment": measure.environment(command), "model": model, "rounds": rounds, "ops": rows, "keys": []}
    if save is not None:
        _save(save, doc)
    o = Output(as_json)
    o.json(doc)
    table = [(r["op"], f"{r['size']} {OPS[r['op']].unit}", f"{r['us']:.2f}", str(OPS[r["op"]].launches)) for r in rows]
    o.table(f"bench --op on {doc['environment']['gpu_name']} ({model})", ["op", "size", "µs", "launches"], table)


def _real_ranks(gpus: int, kind: str | None, tp: str | None, against: str | None, trace: bool) -> str:
    """--gpus T: the TP width (T; --tp, if given, must say it), and every kind one that runs on real ranks."""

    ranks_width(gpus)
    wrong = [t for t in parse_list("--tp", tp, TP_WIDTHS, int) if t != gpus] if tp is not None else []
    if wrong:
        raise UsageError(f"--gpus {gpus} times TP{gpus} keys, one rank per GPU; --tp asks for TP{wrong[0]}")
    if against is not None or trace:
        raise UsageError("--gpus times the launch on real ranks beside the emulation: no --against or --trace with it")
    for k in parse_list("--kind", kind, selectable_kinds(), default=()) if kind else []:
        load_ranks(k)  # a kind without rank functions: a usage error
    return str(gpus)


def _contexts(context: str | None, kinds: list[str]) -> dict[str, list[int]]:
    """Per kind that reads caches, the contexts --context gives (refused when no selected kind reads any)."""
    if context is None:
        return {}
    readers = context_applies(kinds, True)
    values = parse_contexts(context)
    return {k: values for k in readers}


def _resolve_ref(against: str) -> str:
    """The ref's commit (a usage error, exit 2, for a ref git does not know), or the folder given."""

    if "/" in against or against.startswith("."):
        if not (Path(against) / "glm53ctl" / "__init__.py").is_file():
            raise UsageError(f"--against {against}: not a glm53ctl tree (no glm53ctl/__init__.py)")
        return f"tree {Path(against).resolve().name}"
    return resolve(against, repo_root())


def _checkout(against: str, cache: Path) -> Path:

    tree, _ = checkout(against, cache)
    return tree


def _against(this: Path, ref: Path, model, kind, tp, rows, knobs, seed, rounds, context=None) -> dict:

    return against(this, ref, model, kind, tp, rows, knobs, seed, rounds, context)


def _summary_line(r: dict) -> str:
    line = f"{key_label(r)}: {r['us']:.1f} us"
    if "pct_copy" in r:
        line += f", {r['pct_copy']:.1f}% of copy BW (floor {r['floor_us']:.1f} us)"
    for name, b in r["baselines"].items():
        line += f"; {name} {b['us']:.1f} us ({b['ratio']:.2f}x)"
    if "against" in r:
        a = r["against"]
        line += f"; ref {a['ref_us']:.1f} us, this/ref {a['ratio']:.4f} ({a['verdict']})"
    if "ranks" in r:
        line += f"; on {r['tp']} real ranks {r['ranks']['us']:.1f} us ({r['ranks']['ratio']:.2f}x the emulation)"
    return line


def _table(results: list[dict], against: str | None):
    baselines = list(dict.fromkeys(b for r in results for b in r["baselines"]))  # a step adds its other chain
    cols = ["key", "µs", "floor µs", "% copy", "MB"] + [f"{b} µs (×)" for b in baselines]
    if against:
        cols += [f"{against} µs", "this/ref [95% CI]", "δ", "verdict"]
    ranks = any("ranks" in r for r in results)
    if ranks:
        cols += ["real ranks µs (× emulation)", "slowest rank µs"]
    rows = []
    for r in results:
        row = [key_label(r), f"{r['us']:.1f}", f"{r.get('floor_us', 0):.1f}"]
        row += [f"{r.get('pct_copy', 0):.1f}", f"{r['bytes'] / 1e6:.1f}"]
        for b in baselines:
            v = r["baselines"].get(b)
            if v is None:
                row.append("—")
                continue
            bits = "" if v.get("bitwise_equal", True) else " NOT BITWISE"
            row.append(f"{v['us']:.1f} ({v['ratio']:.2f}×){bits}")
        if against:
            a = r["against"]
            lo, hi = a["ratio_ci"]
            row += [f"{a['ref_us']:.1f}", f"{a['ratio']:.4f} [{lo:.4f}, {hi:.4f}]", f"{a['delta']:.3f}", a["verdict"]]
        if ranks:
            rk = r.get("ranks")
            row += [f"{rk['us']:.1f} ({rk['ratio']:.2f}×)", f"{max(rk['per_rank_us']):.1f}"] if rk else ["—", "—"]
        rows.append(row)
    return cols, rows


def to_markdown(doc: dict) -> str:
    """The results as a markdown table with the environment, for a pull request or docs/perf/."""
    e = doc["environment"]
    results = doc["keys"]
    against = doc["against"]["ref"] if doc.get("against") else None
    cols, rows = _table(results, against)
    lines = [
        f"`{e['command']}`",
        "",
        f"{e['gpu_name']} (sm {e['gpu_capability']}), driver {e['driver']}, CUDA {e['cuda']}, torch {e['torch']}, "
        f"Triton {e['triton']}; git {e['git_sha'][:12]}{' (dirty)' if e['git_dirty'] else ''}, code digest "
        f"`{doc['code_digest']}`; {e['date']}. Copy bandwidth {doc['copy_tb_s']:.3f} TB/s in the same run. "
        f"Ratios: baseline / launch (above 1: the launch is faster)"
        + ("; this / ref (below 1: this tree is faster)." if against else "."),
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    # a step rotates no copies of its own (its layers share weights in turn): "2 copies of nothing" said nothing
    rot = sorted(
        {
            f"{r['kind']}: "
            + (r["rotates"] if r["rotates"].startswith("nothing") else f"{r['copies']} copies of {r['rotates']}")
            for r in results
        }
    )
    lines += ["", "Rotated past the L2: " + "; ".join(rot) + "."]
    lines += ["\n" + format_step(r) for r in results if "parts" in r]
    return "\n".join(lines) + "\n"


def format_step(r: dict) -> str:
    """Where a step's time goes: tokens per second per rank, each kind's launches timed alone (their sum, share
    of the step and % of the copy bandwidth) and the gaps between them (the step less the sum of its parts)."""
    us = r["us"]
    lines = [
        f"{key_label(r)}: {us:.1f} µs per step, {r['tokens_per_s']:.0f} tokens/s per rank; its {len(r['parts'])} "
        f"launches timed alone sum to {r['parts_us']:.1f} µs (step / sum {us / r['parts_us']:.3f})",
        "",
        "| part | launches | µs (each alone, summed) | share of the step | % copy |",
        "|---|---|---|---|---|",
    ]
    for kind, s in r["by_kind"].items():
        pct = f"{s['pct_copy']:.1f}" if "pct_copy" in s else ""
        lines.append(f"| {kind} | {s['parts']} | {s['us']:.1f} | {100 * s['share']:.1f}% | {pct} |")
    lines.append(f"| gaps (step − sum) | | {r['gaps_us']:.1f} | {100 * r['gaps_us'] / us:.1f}% | |")
    return "\n".join(lines) + "\n"


def format_step_trace(t: dict) -> str:
    """A traced step: per kind its parts, their mean traced µs and the stage that holds most of their critical
    paths; then the parts whose traced launch is longest, each with its stage."""
    lines = [
        "| kind | parts | traced µs per launch | stage holding its path | µs on the path there (share) |",
        "|---|---|---|---|---|",
    ]
    for kind, s in t["by_kind"].items():
        lines.append(
            f"| {kind} | {s['parts']} | {s['us']:.1f} | {s['holds']} | {s['holds_us']:.1f} "
            f"({100 * s['holds_share']:.0f}%) |"
        )
    slow = sorted(t["parts"], key=lambda p: -p["us"])[:5]
    lines.append("longest: " + ", ".join(f"{p['part']} ({p['kind']}) {p['us']:.1f} µs, {p['holds']}" for p in slow))
    return "\n".join(lines) + "\n"


def format_trace(t: dict) -> str:
    """A traced launch: per stage, then per task type and the critical path (runtime/trace.py)."""

    lines = [
        "| stage | tasks | first claim µs | last publish µs | mean wait µs | mean work µs |",
        "|---|---|---|---|---|---|",
    ]
    for s in t["stages"]:
        lines.append(
            f"| {s['stage']} | {s['tasks']} | {s['first_claim']:.1f} | {s['last_done']:.1f} | {s['wait']:.1f} | "
            f"{s['work']:.1f} |"
        )
    return "\n".join(lines) + "\n" + format_summary(t)


def _save(folder: Path, doc: dict) -> None:

    folder.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%M%S")
    path = folder / f"bench-{doc['model']}-{stamp}.json"

    def write(tmp: Path) -> None:
        tmp.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")

    write_atomic_with(path, write)
    err_console.print(f"saved {path}")
    for r in doc["keys"]:
        if "parts" in r:  # a step: where its time goes, as a picture beside the JSON
            label = key_label(r).replace(" ", "-").lower()
            picture = path.with_name(f"{path.stem}-{label}.svg")
            write_atomic_with(picture, lambda tmp, r=r: tmp.write_text(step_picture(r)))
            err_console.print(f"saved {picture}")
    if any(r["kind"] == "model" for r in doc["keys"]):  # the step over every key timed into this folder
        steps, skipped = saved_steps(folder, doc["model"])
        for name in skipped:
            print_warning(f"{folder / name}: not a bench JSON this version reads; left out of the matrix picture")
        picture = folder / f"bench-{doc['model']}-model-matrix.svg"
        title = f"{doc['model']} step on {doc['environment'].get('gpu_name', 'the GPU')}"

        drawn = matrix_picture(steps, title, TP_WIDTHS, ROWS)  # every key of the matrix: the missing ones say so
        write_atomic_with(picture, lambda tmp: tmp.write_text(drawn))
        err_console.print(f"saved {picture} ({plural(len(steps), 'step keys')})")
