"""`glm53ctl check` and `glm53ctl fault`: how a change is proven safe (DESIGN.md §7)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.commands.build import parse_list
from glm53ctl.errors import CheckFailed, UsageError
from glm53ctl.output import Output, err_console

ModelOpt = Annotated[
    str | None, typer.Option("--model", "-m", help="Model (default: tiny on a CPU, glm53_flash on a GPU).")
]
KindOpt = Annotated[str | None, typer.Option("--kind", "-k", help="Kinds (default: every kind with kernels).")]
TpOpt = Annotated[str | None, typer.Option("--tp", help="TP widths, e.g. 4,8 (default: 1,2,4,8).")]
RowsOpt = Annotated[str | None, typer.Option("--rows", help="Rows, e.g. 1,2 (default: 1,2,4,8).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Results as JSON on stdout.")]


def register(app: typer.Typer) -> None:
    app.command(name="check")(check)
    app.command(name="fault")(fault)


AllKeysOpt = Annotated[
    bool,
    typer.Option("--all-keys", help="On a CPU, every TP x rows key (default there: each TP and each rows once)."),
]


def _setup(model, kind, tp, rows, all_keys: bool = False):
    """Device (a GPU, else Triton's interpreter), weights, and the selected keys: on a GPU, or with --all-keys,
    every TP x rows key; on a CPU, unless --tp or --rows says otherwise, the registry's CPU key set."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    from glm53ctl.kernels.kinds import CPU_KEYS, kernel_kinds
    from glm53ctl.kernels.spec import ROWS, TP_WIDTHS, load_model
    from glm53ctl.kernels.weights import Weights

    spec = load_model(model or ("glm53_flash" if device == "cuda" else "tiny"))
    kinds = parse_list("--kind", kind, kernel_kinds())
    tps = parse_list("--tp", tp, TP_WIDTHS, int)
    for t in tps:
        spec.check_tp(t)
    rowss = parse_list("--rows", rows, ROWS, int)
    if device == "cpu" and not all_keys and tp is None and rows is None:
        pairs = list(CPU_KEYS)
    else:
        pairs = [(t, r) for t in tps for r in rowss]
    keys = [(k, t, r) for k in kinds for t, r in pairs]
    return device, Weights(spec, seed=0, device=device), keys


def check(
    model: ModelOpt = None,
    kind: KindOpt = None,
    tp: TpOpt = None,
    rows: RowsOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs (fresh per key).")] = 0,
    against: Annotated[str | None, typer.Option("--against", help="A git ref: every output bit for bit.")] = None,
    cache: Annotated[Path, typer.Option("--cache", help="Where --against keeps worktrees.")] = Path("build"),
    save: Annotated[Path | None, typer.Option("--save", hidden=True, help="Only save each key's outputs.")] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Worker processes on a CPU (default: one per core); 1 on a GPU.")
    ] = 0,
    all_keys: AllKeysOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Accuracy against the reference, determinism, invariants; with --against, bitwise equality with REF."""
    o = Output(as_json)
    device, weights, keys = _setup(model, kind, tp, rows, all_keys)  # first: it may select the interpreter
    jobs = _jobs(jobs, device, keys)
    from safetensors.torch import load_file, save_file

    from glm53ctl.kernels.checks import key_name, launch_outputs

    if save is not None:  # the other side of --against: outputs only, in this tree's process
        save.mkdir(parents=True, exist_ok=True)
        for k, t, r in keys:
            name = key_name(weights.spec.name, k, t, r)
            save_file(
                launch_outputs(weights, k, t, r, seed, device), str(save / (name.replace("/", "_") + ".safetensors"))
            )
        return
    ref_dir = None
    if against is not None:
        from glm53ctl.worktree import checkout, run_cli

        tree, sha = checkout(against, cache)
        ref_dir = Path(tempfile.mkdtemp(prefix="glm53ctl-against-"))
        # the same keys: one run of the ref for a full TP x rows matrix, else one per (TP, rows) pair (the ref
        # may not know this tree's default key set)
        base = ["check", "--save", str(ref_dir), "--seed", str(seed), "--model", weights.spec.name]
        base += ["--kind", ",".join(dict.fromkeys(k for k, _, _ in keys))]
        pairs = list(dict.fromkeys((t, r) for _, t, r in keys))
        tps, rowss = list(dict.fromkeys(t for t, _ in pairs)), list(dict.fromkeys(r for _, r in pairs))
        grids = [(tps, rowss)] if len(pairs) == len(tps) * len(rowss) else [([t], [r]) for t, r in pairs]
        o.log(f"running {against} ({sha[:12]}) from {tree}")
        for ts, rs in grids:
            args = base + ["--tp", ",".join(map(str, ts)), "--rows", ",".join(map(str, rs))]
            if run_cli(tree, args).returncode:
                raise UsageError(f"{against}'s glm53ctl could not run `check --save`", hint="its error is above")
    results = []
    o.log(f"checking {len(keys)} keys of {weights.spec.name} on {device}" + (f" with {jobs} processes" * (jobs > 1)))
    for (k, t, r), row in zip(keys, _per_key(_check_row, weights, keys, jobs, seed, device), strict=True):
        if ref_dir is not None:
            path = ref_dir / (row["key"].replace("/", "_") + ".safetensors")
            theirs = load_file(str(path)) if path.exists() else {}
            row["against"] = diff = _bitwise(launch_outputs(weights, k, t, r, seed, device), theirs)
            row["bitwise_equal"] = not diff
            if diff:
                row["ok"] = False
        results.append(row)
        if not as_json:
            err_console.print(f"  {'ok  ' if row['ok'] else 'FAIL'} {row['key']}")
    passed = sum(r["ok"] for r in results)
    summary = f"{passed} of {len(results)} configs pass"
    if ref_dir is not None:
        equal = sum(r["bitwise_equal"] for r in results)
        summary = f"{equal} of {len(results)} configs bitwise equal to {against}; {summary}"
    o.json({"device": device, "model": weights.spec.name, "seed": seed, "summary": summary, "keys": results})
    o.table(
        f"check {weights.spec.name} on {device}",
        ["key", "rel RMS (bound)", "grids", "repeats", "written"] + (["vs " + against] if ref_dir else []) + ["result"],
        [
            (
                r["key"],
                ", ".join(f"{n} {e:.1e} ({r['bounds'][n]:g})" for n, e in r["errors"].items()),
                "equal" if r["grids_equal"] else "DIFFER",
                "equal" if r["repeats_equal"] else "DIFFER",
                "yes" if r["invariants"]["every output element written"] else "NO",
                *(["equal" if r["bitwise_equal"] else "; ".join(r["against"])] if ref_dir else []),
                "ok" if r["ok"] else "FAIL: " + "; ".join(r["problems"]),
            )
            for r in results
        ],
    )
    o.text(summary)
    if passed < len(results):
        raise CheckFailed(summary)


def _check_row(model: str, kind: str, tp: int, rows: int, seed: int, device: str, weights=None) -> dict:
    """One key's check as a plain dict (what a worker process sends back)."""
    from glm53ctl.kernels.checks import CheckResult, check_key, key_name

    weights = _weights(model, device, weights)
    try:
        res, _ = check_key(weights, kind, tp, rows, seed, device)
    except CheckFailed as e:  # a LaunchFault in a clean launch: this key fails, the others still run
        res = CheckResult(key_name(weights.spec.name, kind, tp, rows), problems=[f"{type(e).__name__}: {e.message}"])
        res.invariants["every output element written"] = False
    return {
        "key": res.key,
        "ok": res.ok,
        "errors": res.errors,
        "bounds": res.bounds,
        "grids_equal": res.grids_equal,
        "repeats_equal": res.repeats_equal,
        "invariants": res.invariants,
        "problems": res.problems,
    }


def _per_key(fn, weights, keys, jobs: int, *args):
    """fn(model, kind, tp, rows, *args[, weights]) for each key, results in key order: in this process, or in
    `jobs` spawned workers (they inherit TRITON_INTERPRET from this process's environment and draw the same
    seeded weights)."""
    if jobs <= 1:
        for k, t, r in keys:
            yield fn(weights.spec.name, k, t, r, *args, weights=weights)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = [ex.submit(fn, weights.spec.name, k, t, r, *args) for k, t, r in keys]
        for (k, t, r), f in zip(keys, futures, strict=True):
            try:
                yield f.result()
            except BrokenProcessPool:  # a hang ends its worker (os._exit): it printed what hung
                raise CheckFailed(f"a worker process ended during {_key_name(weights, k, t, r)}") from None


def _key_name(weights, kind: str, tp: int, rows: int) -> str:
    from glm53ctl.kernels.checks import key_name

    return key_name(weights.spec.name, kind, tp, rows)


def _jobs(jobs: int, device: str, keys: list) -> int:
    """Worker processes: the interpreter is one core's work per key (a GPU runs the keys in turn)."""
    if jobs < 0:
        raise UsageError(f"--jobs {jobs}: expected 1 or more (0: one per core)")
    return 1 if device != "cpu" else max(1, min(jobs or os.cpu_count() or 1, len(keys)))


def _weights(model: str, device: str, weights):
    if weights is None:
        from glm53ctl.kernels.spec import load_model
        from glm53ctl.kernels.weights import Weights

        weights = Weights(load_model(model), seed=0, device=device)  # seeded: the same tensors in every process
    return weights


def _fault_row(model, kind, tp, rows, device, site, budget_ns, wall_s, weights=None) -> dict:
    """One key's fault test as a plain dict."""
    from glm53ctl.kernels.checks import fault_key

    res = fault_key(_weights(model, device, weights), kind, tp, rows, device, site, budget_ns, wall_s)
    return {
        "key": res.key,
        "sites": res.sites,
        "named": res.named,
        "hangs": res.hangs,
        "retries_equal": res.retries_equal,
        "worst_s": round(res.worst_s, 4),
        "ok": res.ok,
        "problems": res.problems,
    }


def _bitwise(ours: dict, theirs: dict) -> list[str]:
    """Per differing tensor, its name and the first differing element; bits compared, so -0.0 != +0.0
    and two NaNs with the same bits are equal."""
    import torch

    as_int = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    out = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a is None or b is None:
            out.append(f"{name}: only in {'this tree' if b is None else 'the ref'}")
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            out.append(f"{name}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
            continue
        ia = a.contiguous().view(as_int.get(a.dtype, a.dtype))
        ib = b.contiguous().view(as_int.get(b.dtype, b.dtype))
        ne = ia != ib
        if ne.any():
            idx = tuple(int(i) for i in ne.nonzero()[0])
            out.append(f"{name}{list(idx)}: {float(a[idx]):.6g} vs {float(b[idx]):.6g}")
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
    as_json: JsonOpt = False,
) -> None:
    """Stick each guarded wait on purpose: LaunchFault names it, nothing hangs, the retry is bitwise clean."""
    if site is not None and all_sites:
        raise UsageError("--site and --all exclude each other")
    if budget_ms <= 0 or wall_s <= 0:
        raise UsageError("--budget-ms and --wall-s must be positive")
    o = Output(as_json)
    device, weights, keys = _setup(model, kind, tp, rows, all_keys)  # first: it may select the interpreter
    jobs = _jobs(jobs, device, keys)
    results = []
    budget_ns = int(budget_ms * 1e6)
    for row in _per_key(_fault_row, weights, keys, jobs, device, site, budget_ns, wall_s):
        results.append(row)
        if not as_json:
            err_console.print(f"  {'ok  ' if row['ok'] else 'FAIL'} {row['key']}: {row['named']}/{row['sites']} named")
    tot = {f: sum(r[f] for r in results) for f in ("sites", "named", "hangs", "retries_equal")}
    summary = (
        f"{tot['sites']} sites tried, {tot['named']} named correctly, {tot['hangs']} hangs, "
        f"{tot['retries_equal']} retries bitwise equal"
    )
    o.json({"device": device, "model": weights.spec.name, "summary": summary, "totals": tot, "keys": results})
    o.table(
        f"fault {weights.spec.name} on {device} (budget {budget_ms:g} ms)",
        ["key", "sites", "named", "hangs", "retries equal", "slowest fault", "result"],
        [
            (
                r["key"],
                r["sites"],
                r["named"],
                r["hangs"],
                r["retries_equal"],
                f"{r['worst_s'] * 1e3:.1f} ms",
                "ok" if r["ok"] else "FAIL: " + "; ".join(r["problems"][:3]),
            )
            for r in results
        ],
    )
    o.text(summary)
    if not all(r["ok"] for r in results):
        raise CheckFailed(summary)
