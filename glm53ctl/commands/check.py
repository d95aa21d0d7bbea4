"""`glm53ctl check` and `glm53ctl fault`: how a change is proven safe (docs/design.md §7)."""

from __future__ import annotations

import math
import os
import re
import tempfile
from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands import Command
from glm53ctl.commands.build import parse_list
from glm53ctl.commands.keys import (
    KernelCacheOpt,
    attach_kernels,
    context_applies,
    context_fits,
    context_of,
    counted_compiles,
    print_kernels,
    ranks_width,
)
from glm53ctl.errors import CheckFailed, UsageError
from glm53ctl.interrupts import interrupted, kill_workers, worker_pool
from glm53ctl.kernels.checks import (
    HANG_LOG_ENV,
    CheckResult,
    build_launches,
    check_key,
    fault_key,
    fault_row,
    launch_outputs,
    ranks_fault_key,
    ranks_key,
)
from glm53ctl.kernels.kernel_cache import counting, open_cache
from glm53ctl.kernels.kinds import CPU_KEYS, kernel_kinds, load_ranks, ranks_kinds, selectable_kinds
from glm53ctl.kernels.numerics import bits
from glm53ctl.kernels.spec import ROW_COUNTS, ROWS, TP_WIDTHS, load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.output import Heartbeat, Output, Progress, err_console, plural, print_warning
from glm53ctl.tuning.knobs import resolve_key
from glm53ctl.worktree import checkout, finder_code, run_cli, this_tree

ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model (default: tiny on a CPU, glm53_flash on a GPU).")
]
KindOpt = Annotated[str | None, typer.Option("--kind", "-k", help="Kinds (default: every kind with kernels).")]
TpOpt = Annotated[str | None, typer.Option("--tp", help="TP widths, e.g. 4,8 (default: 1,2,4,8).")]
RowsOpt = Annotated[str | None, typer.Option("--rows", help="Rows, e.g. 1,2 (default: 1,2,4,8).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Results as JSON on stdout.")]
ContextOpt = Annotated[
    int | None,
    typer.Option(
        "--context",
        min=0,
        help="Tokens cached before the step (row r: r*3 fewer), for the kinds that read caches (sparse); "
        "default: rows below and above the selection width mixed.",
    ),
]


def register(app: typer.Typer) -> None:
    app.command(name="check", cls=Command)(check)
    app.command(name="fault", cls=Command)(fault)


GpusOpt = Annotated[
    int,
    typer.Option(
        "--gpus",
        min=1,
        help="Ranks in processes of their own: 1 is the one-device emulation (the default); T runs TP-T keys on "
        "T GPUs, one rank each (on a CPU, T processes under the interpreter), against the emulation.",
    ),
]


def _real_ranks(gpus: int, kind, tp, rows) -> None:
    """--gpus T: every selected key at TP T, and every kind one that runs on real ranks (before torch loads)."""

    ranks_width(gpus)
    if tp is None:
        raise UsageError(f"--gpus {gpus}: say the TP width too (--tp {gpus}): one rank per GPU")
    wrong = [t for t in parse_list("--tp", tp, TP_WIDTHS, int) if t != gpus]
    if wrong:
        raise UsageError(f"--gpus {gpus} runs TP{gpus} keys, one rank per GPU; --tp asks for TP{wrong[0]}")
    # without --kind: the kinds that run on real ranks
    for k in parse_list("--kind", kind, selectable_kinds(), default=ranks_kinds()):
        load_ranks(k)
    parse_list("--rows", rows, ROW_COUNTS, int, default=ROWS)


def _ranks_kinds() -> str:

    return ",".join(ranks_kinds())


AllKeysOpt = Annotated[
    bool,
    typer.Option("--all-keys", help="On a CPU, every TP x rows key (default there: each TP and each rows once)."),
]


def _setup(model, kind, tp, rows, all_keys: bool = False, context: int | None = None, context_warned: bool = False):
    """Device (a GPU, else Triton's interpreter), weights, and the selected keys, each resolved once (its knobs
    in force, the lookup's warnings printed here, once per key): on a GPU, or with --all-keys, every TP x rows
    key; on a CPU, unless --tp or --rows says otherwise, the registry's CPU key set. The options are checked
    before torch is imported: a usage error costs no seconds. `context_warned`: a tuned entry at another context
    is warned of too (check's keys; fault's run at the kind's own contexts)."""

    kinds = parse_list("--kind", kind, selectable_kinds(), default=kernel_kinds())
    tps = parse_list("--tp", tp, TP_WIDTHS, int)
    rowss = parse_list("--rows", rows, ROW_COUNTS, int, default=ROWS)
    if model is not None:
        load_model(model)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

    spec = load_model(model or ("glm53_flash" if device == "cuda" else "tiny"))
    for t in tps:
        spec.check_tp(t)
    if device == "cpu" and not all_keys and tp is None and rows is None:
        pairs = list(CPU_KEYS)
    else:
        pairs = [(t, r) for t in tps for r in rowss]
    if context is not None:  # before a table or a cache of that size is made
        context_fits(spec, kinds, sorted({r for _, r in pairs}), [context], device)
    keys = [
        resolved(spec.name, k, t, r, device, context_of(k, context), context_warned) for k in kinds for t, r in pairs
    ]
    return device, Weights(spec, seed=0, device=device), keys


def resolved(model: str, kind: str, tp: int, rows: int, device, context: int | None, context_warned: bool = False):
    """One key as a command starts it (tuning/knobs.py `resolve_key`), what its lookup said printed once."""

    key = resolve_key(model, kind, tp, rows, None, device, context, context_warned)
    for w in key.warnings:
        print_warning(w)
    return key


def check(
    model: ModelOpt = None,
    kind: KindOpt = None,
    tp: TpOpt = None,
    rows: RowsOpt = None,
    context: ContextOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs (fresh per key).")] = 0,
    against: Annotated[
        str | None,
        typer.Option("--against", metavar="REF", help="A git ref (or a tree's folder): every output bit for bit."),
    ] = None,
    worktrees: Annotated[
        Path, typer.Option("--worktrees", metavar="DIR", help="Where --against keeps worktrees.")
    ] = Path("build"),
    cache: KernelCacheOpt = None,
    save: Annotated[Path | None, typer.Option("--save", hidden=True, help="Only save each key's outputs.")] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Worker processes on a CPU (default: one per core); 1 on a GPU.")
    ] = 0,
    all_keys: AllKeysOpt = False,
    gpus: GpusOpt = 1,
    launch: Annotated[
        str | None,
        typer.Option(
            "--launch",
            metavar="SCHEDULE",
            help="persistent or stages: the keys in this schedule (default: each key's own, knob launch; the "
            "other one is proven bitwise equal to it on one device); with --gpus, the ranks run this one.",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Every output's error in the table.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Accuracy against the reference, determinism, invariants; with --against, bitwise equality with REF; with
    --gpus T, every rank's outputs on real ranks bitwise equal to the one-device emulation."""
    o = Output(as_json)
    _jobs_given(jobs)
    _cache_given(cache)
    if context is not None:  # before torch is imported: a usage error costs no seconds
        context_applies(parse_list("--kind", kind, selectable_kinds(), default=kernel_kinds()), True)
    if gpus > 1:
        if against is not None or context is not None or save is not None:
            raise UsageError("--gpus takes no --against, --context or --save yet")
        _real_ranks(gpus, kind, tp, rows)
        kind = kind or _ranks_kinds()
    _schedule_ok(launch)
    # first: it may select the interpreter
    device, weights, keys = _setup(model, kind, tp, rows, all_keys, context, context_warned=True)
    keys = _in_schedule(keys, launch)
    if gpus > 1:
        _check_ranks(o, weights, keys, seed, device)
        return
    jobs = _jobs(jobs, device, keys)
    with counted_compiles(cache) as compiles:
        if save is not None:  # the other side of --against: outputs only, in this tree's process
            _save_outputs(weights, keys, seed, save)
            print_kernels(o, compiles())
            return
        ref_dir = None
        if against is None:
            results = _check_keys(weights, keys, jobs, seed, device, None)
        else:
            with tempfile.TemporaryDirectory(prefix="glm53ctl-against-") as tmp:  # removed however the run ends
                try:
                    ref_dir = _run_ref(against, worktrees, weights, keys, seed, Path(tmp), o, context)
                except KeyboardInterrupt:  # REF's process is stopped with it (worktree.run_cli)
                    raise interrupted(f"while {against} computed its outputs, before this tree checked a key") from None
                results = _check_keys(weights, keys, jobs, seed, device, ref_dir)
        counts = compiles()
    attach_kernels(results, counts)
    passed = sum(r["ok"] for r in results)
    summary = f"{passed} of {len(results)} configs pass"
    if ref_dir is not None:
        equal = sum(r["bitwise_equal"] for r in results)
        summary = f"{equal} of {len(results)} configs bitwise equal to {against}; {summary}"
    o.json({"device": device, "model": weights.spec.name, "seed": seed, "summary": summary, "keys": results})
    o.table(
        f"check {weights.spec.name} on {device}",
        TABLE_COLUMNS + ([f"vs {against}"] if ref_dir else []) + ["result"],
        [_table_row(r, ref_dir is not None, verbose) for r in results],
        width=TABLE_WIDTH,
    )
    print_kernels(o, counts)
    o.text(summary)
    if passed < len(results):
        raise CheckFailed(summary)


def _check_ranks(o: Output, weights, keys, seed: int, device: str) -> None:
    """`check --gpus T`: each key on T real ranks against the one-device emulation, bit for bit."""

    err_console.print(f"running {plural(len(keys), 'keys')} of {weights.spec.name} on real ranks ({device})")
    progress = Progress(len(keys))
    results = []
    with progress.stops("checked on real ranks"):
        for key in keys:
            row = ranks_key(weights, key, seed)
            row["ok"] = not row["problems"]
            results.append(row)
            line = f"{'ok  ' if row['ok'] else 'FAIL'} {row['key']}: {row['equal']}/{row['launches']} bitwise equal"
            err_console.print(progress.line(line))
    equal, total = sum(r["equal"] for r in results), sum(r["launches"] for r in results)
    summary = f"{equal} of {total} rank launches bitwise equal to the one-device emulation"
    o.json({"device": device, "model": weights.spec.name, "seed": seed, "summary": summary, "keys": results})
    o.table(
        f"check {weights.spec.name} on real ranks ({device})",
        ["key", "ranks", "rank launches", "bitwise equal", "result"],
        [
            (r["key"], r["ranks"], r["launches"], r["equal"], "ok" if r["ok"] else "FAIL: " + r["problems"][0])
            for r in results
        ],
    )
    o.text(summary)
    if equal < total:
        raise CheckFailed(summary)


def _save_outputs(weights, keys, seed: int, save: Path) -> None:
    from safetensors.torch import save_file

    save.mkdir(parents=True, exist_ok=True)
    for i, key in enumerate(keys, 1):
        path = str(save / (key.name.replace("/", "_") + ".safetensors"))
        with counting(key.name):
            save_file(launch_outputs(weights, key, seed), path)
        err_console.print(f"  [{i}/{len(keys)}] saved {key.name}", highlight=False)


def _run_ref(
    against: str, cache: Path, weights, keys, seed: int, ref_dir: Path, o: Output, context: int | None = None
) -> Path:
    """REF's outputs for the same keys, saved into ref_dir by REF's own glm53ctl in a process of its own: one
    run for a full TP x rows matrix, else one per (TP, rows) pair (REF may not know this tree's key sets)."""

    tree, sha = checkout(against, cache)
    base = ["check", "--save", str(ref_dir), "--seed", str(seed), "--model", weights.spec.name]
    base += ["--kind", ",".join(dict.fromkeys(k.kind for k in keys))]
    base += ["--context", str(context)] if context is not None else []
    pairs = list(dict.fromkeys((k.tp, k.rows) for k in keys))
    tps, rowss = list(dict.fromkeys(t for t, _ in pairs)), list(dict.fromkeys(r for _, r in pairs))
    grids = [(tps, rowss)] if len(pairs) == len(tps) * len(rowss) else [([t], [r]) for t, r in pairs]
    n = plural(len(keys), "keys")
    o.log(f"running {against} ({sha[:12]}) from {tree}: its outputs for {n}, then this tree's checks")
    for ts, rs in grids:
        args = base + ["--tp", ",".join(map(str, ts)), "--rows", ",".join(map(str, rs))]
        if run_cli(tree, args).returncode:
            raise UsageError(f"{against}'s glm53ctl could not run `check --save`", hint="its error is above")
    return ref_dir


def _check_keys(weights, keys, jobs: int, seed: int, device: str, ref_dir: Path | None) -> list[dict]:
    """Every key's check (and, with ref_dir, its bits against REF's), a progress line on stderr as each ends."""
    from safetensors.torch import load_file

    where = f" with {jobs} processes" if jobs > 1 else ""
    err_console.print(f"checking {plural(len(keys), 'keys')} of {weights.spec.name} on {device}{where}")
    costs = _costs(weights.spec, keys)
    progress = Progress(len(keys), costs)
    results: list[dict | None] = [None] * len(keys)
    # closing: an interrupt between two keys stops the workers now, not when the generator is collected
    with progress.stops("checked"), closing(_per_key(_check_row, weights, keys, jobs, seed, costs=costs)) as ends:
        for i, row in ends:
            if ref_dir is not None:
                path = ref_dir / (row["key"].replace("/", "_") + ".safetensors")
                theirs = load_file(str(path)) if path.exists() else {}
                row["against"] = diff = _bitwise(launch_outputs(weights, keys[i], seed), theirs)
                row["bitwise_equal"] = not diff
                if diff:  # a failure of its own, said first: the table names every tensor that differs
                    row["problems"].insert(0, f"other bits than the ref: {', '.join(tensor_names(diff))}")
                    row["ok"] = False
            results[i] = row
            worst = f" ({_worst(row)})" if row["errors"] else ""
            err_console.print(progress.line(f"{'ok  ' if row['ok'] else 'FAIL'} {row['key']}{worst}", costs[i]))
    return results


def _costs(spec, keys, per_site: bool = False) -> list[float]:
    """What each key weighs in the estimate of the time left and in the order workers take keys (the heaviest
    first). In the interpreter: the tasks its launches run (its time goes with them), times its sites for
    `fault` (a stuck launch and its retry each). On a GPU a launch takes microseconds and a key's time goes with
    its compiles, its launches' count and, for `fault`, its sites' budgets: the sites, not sites times tasks (a
    GPU `fault` once said "~10809:03 left" after embed's 8 sites for tail's 3,076, done in 20 s). From the tables
    alone: nothing is launched."""

    costs = []
    for key in keys:
        launches = build_launches(spec, key)
        tasks = sum(len(la.table.tasks) for _, la in launches) + 1
        sites = sum(len(la.table.sites) for name, la in launches if name.split(".")[-1] == "launch")
        if key.device != "cpu":
            costs.append(float(len(launches) + (2 * sites + 1) / 100 if per_site else len(launches)))
        else:
            costs.append(float(tasks * (2 * sites + 1) if per_site else tasks))
    return costs


def _worst(row: dict) -> str:
    """The output nearest its bound: 'ffn.out 5.2e-03 (2e-02)', or '' when there are none."""
    errors, bounds = row["errors"], row["bounds"]
    if not errors:
        return ""

    def how_bad(n: str) -> float:
        e = errors[n]
        if e != e:  # NaN: the worst of all
            return math.inf
        return e / bounds[n] if bounds[n] else (0.0 if e == 0 else math.inf)

    name = max(errors, key=how_bad)
    return f"{name} {errors[name]:.1e} ({bounds[name]:g})"


def _margin(errors: dict, bounds: dict) -> str:
    """How far the worst output is inside its bound ('4.0x': a quarter of it), 'exact', or 'OVER'."""
    if not errors:
        return ""
    if any(not errors[n] <= bounds[n] for n in errors):  # NaN too
        return "OVER"
    worst = max((errors[n] / bounds[n] for n in errors if bounds[n]), default=0.0)
    return "exact" if worst == 0 else f"{1 / worst:.1f}x"


# what the table shows of a key, in at most 100 columns (a failure's text wrapped); the record: --json, every
# output's error: -v
TABLE_COLUMNS = ["key", "worst output (bound)", "margin", "bits, writes"]
SCHEDULES = ("persistent", "stages")  # the values of knob `launch` (kernels/kinds/base.py LAUNCH)


def _schedule_ok(launch: str | None) -> None:
    if launch is not None and launch not in SCHEDULES:
        raise UsageError(f"--launch {launch!r}: expected one of {', '.join(SCHEDULES)}")


def _in_schedule(keys: list, launch: str | None) -> list:
    """--launch: every key that has the knob in that schedule (a step's handed to every part)."""
    if launch is None:
        return keys
    return [key.with_knobs({"launch": launch}) if "launch" in key.knobs else key for key in keys]


TABLE_WIDTH = 100


def _short(text: str, width: int = 36) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _table_row(r: dict, against: bool, verbose: bool) -> tuple:
    """One key in the table: the worst output and its margin to the bound (every output with -v); whether
    grids and repeated launches gave the same bits and every output element was written; the first problem."""
    errors, bounds = r["errors"], r["bounds"]
    if verbose:
        worst = ", ".join(f"{n} {e:.1e} ({bounds[n]:g})" for n, e in errors.items())
    else:
        worst = _worst(r)
    equal = (("grids differ", r["grids_equal"]), ("repeats differ", r["repeats_equal"]))
    equal += (("schedules differ", r.get("schedules_equal", True)),)
    broken = [w for w, ok in equal if not ok]
    if not r["invariants"].get("every output element written", False):
        broken.append("unwritten")
    return (
        r["key"],
        worst,
        _margin(errors, bounds),
        ", ".join(broken) or "same, all",
        *([("equal" if r["bitwise_equal"] else _first_difference(r["against"]))] if against else []),
        "ok" if r["ok"] else "FAIL: " + (_short(r["problems"][0]) if verbose is False else "; ".join(r["problems"])),
    )


def _check_row(key, seed: int, weights=None) -> dict:
    """One key's check as a plain dict (what a worker process sends back)."""

    weights = _weights(key, weights)
    try:
        with Heartbeat(key.name) as beat, counting(key.name):
            res, _ = check_key(weights, key, seed, tick=beat)
    except CheckFailed as e:  # a LaunchFault in a clean launch: this key fails, the others still run
        res = CheckResult(key.name, problems=[f"{type(e).__name__}: {e.message}"])
        res.invariants["every output element written"] = False
    return {
        "key": res.key,
        "ok": res.ok,
        "errors": res.errors,
        "bounds": res.bounds,
        "grids_equal": res.grids_equal,
        "repeats_equal": res.repeats_equal,
        "schedules_equal": res.schedules_equal,
        "invariants": res.invariants,
        "problems": res.problems,
    }


def _per_key(fn, weights, keys, jobs: int, *args, costs: list[float] | None = None, reaped: bool = False):
    """(i, fn(key, *args[, weights])) for each resolved key i, as each finishes: in this process, or in `jobs`
    spawned workers (they inherit this process's environment, so TRITON_INTERPRET and the registry's
    $GLM53CTL_KINDS, and draw the same seeded weights). Workers take the heaviest keys first (`costs`): the
    last key to end is then a light one. `reaped` (fault): always in workers, and a worker that a hang ended
    (its watchdog left the key's result in the hang log, kernels/checks.py) is reaped: its key is reported from
    the log and the keys not yet done go on in fresh workers."""
    order = sorted(range(len(keys)), key=lambda i: -costs[i]) if costs and jobs > 1 else range(len(keys))
    if jobs <= 1 and not reaped:
        import torch  # the CLI imports torch where a command runs, not to start

        group = None
        for i in order:
            if weights is not None and torch.cuda.is_available() and (keys[i].kind, keys[i].tp) != group:
                # another kind or width reads other tensors: the last ones' go, or the GPU holds every kind's
                # shards of every width at once (12 keys of three kinds at TP4 and TP8 filled an 80 GB H100)
                group = (keys[i].kind, keys[i].tp)
                weights.drop_raw()
                torch.cuda.empty_cache()
            yield i, fn(keys[i], *args, weights=weights)
        return
    pending = list(order)
    while pending:
        hung = yield from _in_workers(fn, keys, pending, jobs, args, reaped)
        for i, row in hung:
            pending.remove(i)
            yield i, row


def _in_workers(fn, keys, pending: list[int], jobs: int, args: tuple, reaped: bool):
    """The `pending` keys in a pool of workers, each yielded (and taken from `pending`) as it ends, until all
    are done or a worker ends: then the keys that the hang log says hung, (i, row) each (`_per_key`)."""
    import json
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    with tempfile.TemporaryDirectory(prefix="glm53ctl-hangs-") as tmp:
        log = Path(tmp) / "hangs.jsonl"
        os.environ[HANG_LOG_ENV] = str(log)  # inherited by the workers spawned below
        try:
            # workers import this tree's glm53ctl, whatever is installed (a ref's tree runs its own check this way)
            with worker_pool(jobs, finder_code(this_tree())) as ex:
                futures = {ex.submit(fn, keys[i], *args): i for i in pending}
                for f in as_completed(futures):
                    i = futures[f]
                    try:
                        row = f.result()
                    except BrokenProcessPool:
                        break
                    pending.remove(i)
                    yield i, row
                else:
                    return []
                kill_workers(ex)  # the other workers' keys go on in a fresh pool
        finally:
            os.environ.pop(HANG_LOG_ENV, None)
        rows = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    index = {keys[i].name: i for i in pending}
    hung = [(index[r["key"]], r) for r in rows if r["key"] in index]
    if not reaped or not hung:  # no hang said why: a worker died (killed, out of memory)
        name = keys[pending[0]].name if len(pending) == 1 else f"one of {', '.join(keys[i].name for i in pending)}"
        raise CheckFailed(f"a worker process ended during {name}")
    return hung


def _cache_given(cache: Path | None) -> None:
    """--cache as given, before torch is imported (exit 2 unless a kernel cache)."""
    if cache is not None:
        open_cache(cache)


def _jobs_given(jobs: int) -> None:
    """--jobs as given, before torch is imported (a usage error costs no seconds)."""
    if jobs < 0:
        raise UsageError(f"--jobs {jobs}: expected 1 or more (0: one per core)")


def _jobs(jobs: int, device: str, keys: list) -> int:
    """Worker processes: the interpreter is one core's work per key (a GPU runs the keys in turn)."""
    return 1 if device != "cpu" else max(1, min(jobs or os.cpu_count() or 1, len(keys)))


def _weights(key, weights):
    if weights is None:
        # seeded: the same tensors in every process
        weights = Weights(load_model(key.model), seed=0, device=key.device)
    return weights


def _fault_row(key, site, budget_ns, wall_s, weights=None) -> dict:
    """One key's fault test as a plain dict."""

    with Heartbeat(key.name) as beat, counting(key.name):
        res = fault_key(_weights(key, weights), key, site, budget_ns, wall_s, tick=beat)
    return fault_row(res)


def _site_count(spec, key) -> int:
    """The guarded waits of a key's launch (rank 0's), from its table alone: nothing is launched."""
    return len(_waits(spec, key))


def _waits(spec, key) -> list[str]:
    """Each guarded wait of a key's launch (rank 0's: its stage launches in a stages build, every part's in a
    step) as 'waiter <- producer', in site order, from the tables alone."""

    out = []
    for name, la in build_launches(spec, key):
        if name.split(".")[-1] != "launch":  # rank 0's launch, a stage's, or a step's part's (`layers.3.launch`)
            continue
        t = la.table
        for site in t.sites:
            producers = " + ".join(dict.fromkeys("peer" if p < 0 else t.type_name(p) for p in site.producers))
            out.append(f"{t.type_name(site.task)} <- {producers}" + (" (late)" if site.late else ""))
    return out


def _waits_summary(waits: list[str]) -> str:
    """'attn reduce <- peer ×4, ...': each kind of wait and how many sites it has, in first-seen order."""
    from collections import Counter

    return ", ".join(f"{w} ×{n}" for w, n in Counter(waits).items())


def _first_difference(diff: list[str]) -> str:
    """The table's view of a bitwise difference: the first differing tensor whole (its first differing element, the
    two values, how many elements differ), then the other tensors by name."""
    rest = tensor_names(diff[1:])
    return diff[0] + (f"; also {', '.join(rest)}" if rest else "")


def tensor_names(diff: list[str]) -> list[str]:
    """The tensors a `_bitwise` list names ('H[0, 1]: 1 vs 2' -> 'H'), in its order."""
    return [re.split(r"[\[:]", d, maxsplit=1)[0] for d in diff]


def _bitwise(ours: dict, theirs: dict) -> list[str]:
    """Per differing tensor, its name and the first differing element; bits compared, so -0.0 != +0.0
    and two NaNs with the same bits are equal."""

    out = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a is None or b is None:
            out.append(f"{name}: only in {'this tree' if b is None else 'the ref'}")
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{name}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
            continue
        ia, ib = bits(a), bits(b)
        ne = ia != ib
        if ne.any():
            idx = tuple(int(i) for i in ne.nonzero()[0])
            n = int(ne.sum())
            out.append(
                f"{name}{list(idx)}: {float(a[idx]):.6g} vs {float(b[idx]):.6g} ({n:,} of {ne.numel():,} differ)"
            )
    return out


def fault(
    model: ModelOpt = None,
    kind: KindOpt = None,
    tp: TpOpt = None,
    rows: RowsOpt = None,
    site: Annotated[int | None, typer.Option("--site", help="Stick this site only.")] = None,
    all_sites: Annotated[bool, typer.Option("--all", help="Stick every site in turn (the default).")] = False,
    budget_ms: Annotated[float, typer.Option("--budget-ms", help="Time a stuck wait is given.")] = 2.0,
    wall_s: Annotated[float, typer.Option("--wall-s", help="A launch slower than this is a hang.")] = 60.0,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Worker processes on a CPU (default: one per core); 1 on a GPU.")
    ] = 0,
    all_keys: AllKeysOpt = False,
    gpus: GpusOpt = 1,
    list_sites: Annotated[bool, typer.Option("--list", help="List the keys and their sites; stick nothing.")] = False,
    launch: Annotated[
        str | None,
        typer.Option(
            "--launch",
            metavar="SCHEDULE",
            help="persistent or stages: the keys in this schedule (default: each key's own, knob launch); "
            "a stages build keeps the waits inside its stages and on its peers, and sticks those.",
        ),
    ] = None,
    cache: KernelCacheOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stick each guarded wait on purpose: LaunchFault names it, nothing hangs, the retry is bitwise clean. With
    --gpus T, each rank in turn never publishes: every other rank names it, nothing hangs, the retry is clean."""
    if site is not None and all_sites:
        raise UsageError("--site and --all exclude each other")
    _jobs_given(jobs)
    _cache_given(cache)
    if not (0 < budget_ms < 1e6 and 0 < wall_s < 1e6):  # NaN and inf fail too
        raise UsageError("--budget-ms and --wall-s must be positive and finite (under 10^6)")
    if gpus > 1:
        if site is not None or list_sites:
            raise UsageError("--gpus sticks a peer's publish, not a site: no --site or --list with it")
        _real_ranks(gpus, kind, tp, rows)
        kind = kind or _ranks_kinds()
    _schedule_ok(launch)
    o = Output(as_json)
    device, weights, keys = _setup(model, kind, tp, rows, all_keys)  # first: it may select the interpreter
    keys = _in_schedule(keys, launch)
    if gpus > 1:
        _fault_ranks(o, weights, keys, device, int(budget_ms * 1e6), wall_s)
        return
    waits = {key: _waits(weights.spec, key) for key in keys}  # the tables alone: no launch
    sites = {key: len(w) for key, w in waits.items()}
    if list_sites:
        rows_ = [
            {"key": key.name, "launch": key.knobs.get("launch"), "sites": len(w), "waits": w}
            for key, w in waits.items()
        ]
        o.json({"device": device, "model": weights.spec.name, "keys": rows_, "sites": sum(sites.values())})
        o.table(
            f"fault sites of {weights.spec.name} on {device}",
            ["key", "sites", "--site range", "waits (waiter <- producer)"],
            [(r["key"], r["sites"], f"0..{r['sites'] - 1}", _waits_summary(r["waits"])) for r in rows_],
        )
        n_sites, n_keys = plural(sum(sites.values()), "sites"), plural(len(keys), "keys")
        o.text(f"{n_sites} in {n_keys}: one stuck launch each with --all")
        return
    if site is not None:
        short = [f"{key.name} has sites 0..{n - 1}" for key, n in sites.items() if not 0 <= site < n]
        if short:
            raise UsageError(f"--site {site}: " + "; ".join(short), hint="`glm53ctl fault --list` lists every key's")
    jobs = _jobs(jobs, device, keys)
    budget_ns = int(budget_ms * 1e6)
    tried = sum(sites.values()) if site is None else len(keys)
    err_console.print(
        f"sticking {plural(tried, 'sites')} of {plural(len(keys), 'keys')} of {weights.spec.name} on {device}"
    )
    costs = _costs(weights.spec, keys, per_site=site is None)
    progress = Progress(len(keys), costs)
    results = [None] * len(keys)
    ends = closing(_per_key(_fault_row, weights, keys, jobs, site, budget_ns, wall_s, costs=costs, reaped=True))
    with counted_compiles(cache) as compiles, progress.stops("fault-tested"), ends as ends:
        for i, row in ends:
            results[i] = row
            line = f"{'ok  ' if row['ok'] else 'FAIL'} {row['key']}: {row['named']}/{row['sites']} named"
            err_console.print(progress.line(line, costs[i]))
        counts = compiles()
    attach_kernels(results, counts)
    tot = {f: sum(r[f] for r in results) for f in ("sites", "named", "hangs", "retries_equal")}
    summary = (
        f"{plural(tot['sites'], 'sites')} tried, {tot['named']} named correctly, {plural(tot['hangs'], 'hangs')}, "
        f"{plural(tot['retries_equal'], 'retries', 'retry')} bitwise equal"
    )
    _fault_report(
        o,
        f"fault {weights.spec.name} on {device} (budget {budget_ms:g} ms)",
        {"device": device, "model": weights.spec.name, "summary": summary, "totals": tot},
        results,
        ["sites", "slowest fault"],
        lambda r: [r["sites"], f"{r['worst_s'] * 1e3:.1f} ms"],
        lambda r: "; ".join(r["problems"][:3]),
        kernels=counts,
    )


def _fault_ranks(o: Output, weights, keys, device: str, budget_ns: int, wall_s: float) -> None:
    """`fault --gpus T`: per key, each rank in turn never publishes its tag; then each in turn is killed during
    its launch."""

    err_console.print(
        f"muting each rank of {plural(len(keys), 'keys')} of {weights.spec.name} in turn ({device})", highlight=False
    )
    progress = Progress(len(keys))
    results = []
    with progress.stops("fault-tested on real ranks"):
        for key in keys:
            row = ranks_fault_key(weights, key, budget_ns, wall_s)
            row["ok"] = not row["problems"]
            results.append(row)
            err_console.print(progress.line(f"{'ok  ' if row['ok'] else 'FAIL'} {row['key']}"))
    fields = ("peers", "named", "hangs", "retries_equal", "killed", "killed_reported")
    tot = {f: sum(r[f] for r in results) for f in fields}
    summary = (
        f"{plural(tot['peers'], 'peers')} muted, {tot['named']} named by every other rank, "
        f"{plural(tot['hangs'], 'hangs')}, {plural(tot['retries_equal'], 'retries', 'retry')} bitwise equal on "
        f"every rank; {plural(tot['killed'], 'ranks')} killed mid-launch, {tot['killed_reported']} reported dead "
        "and named by every other rank"
    )
    _fault_report(
        o,
        f"fault {weights.spec.name} on real ranks ({device})",
        {"device": device, "model": weights.spec.name, "summary": summary, "totals": tot},
        results,
        ["peers muted", "killed: reported"],
        lambda r: [r["peers"], f"{r['killed']}: {r['killed_reported']}"],
        lambda r: r["problems"][0],
    )


def _fault_report(
    o: Output, title: str, head: dict, results: list[dict], counted, counts, problems, kernels=None
) -> None:
    """A fault run's report, on one GPU or on real ranks: the JSON (`head` and the keys), a row per key (its
    `counted` columns, then named, hangs, retries equal and the result), the summary; exit 1 when a key failed."""
    o.json(head | {"keys": results})
    o.table(
        title,
        ["key", counted[0], "named", "hangs", "retries equal", *counted[1:], "result"],
        [
            (
                r["key"],
                counts(r)[0],
                r["named"],
                r["hangs"],
                r["retries_equal"],
                *counts(r)[1:],
                "ok" if r["ok"] else "FAIL: " + problems(r),
            )
            for r in results
        ],
    )
    print_kernels(o, kernels or {})
    o.text(head["summary"])
    if not all(r["ok"] for r in results):
        raise CheckFailed(head["summary"])
