"""`glm53ctl tune`: Optuna studies over each key's knobs, and the keep rule (docs/design.md §8; tuning/tune.py)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from glm53ctl.commands import Command
from glm53ctl.commands.bench import key_label
from glm53ctl.commands.build import parse_list
from glm53ctl.commands.keys import (
    KernelCacheOpt,
    context_applies,
    context_fits,
    context_of,
    counted_compiles,
    print_kernels,
    refuse_steps,
)
from glm53ctl.errors import UsageError
from glm53ctl.kernels.kernel_cache import Counts, counting
from glm53ctl.kernels.kinds import kernel_kinds, selectable_kinds
from glm53ctl.kernels.spec import ROW_COUNTS, ROWS, TP_WIDTHS, load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.output import Output, err_console, print_warning
from glm53ctl.tuning import measure
from glm53ctl.tuning import tune as tuning
from glm53ctl.tuning.bench import compile_workers, environment_ok, gpu_count, precompile
from glm53ctl.tuning.knobs import defaults, kind_knobs, resolve_key
from glm53ctl.tuning.storage import DEFAULT_STORAGE, check_storage, shown
from glm53ctl.tuning.tune import base_of, space_of
from glm53ctl.tuning.write import write_results


def register(app: typer.Typer) -> None:
    app.command(name="tune", cls=Command)(tune)


def tune(
    tp: Annotated[str, typer.Option("--tp", help="TP widths, e.g. 4 or 1,2,4,8.")],
    rows: Annotated[str, typer.Option("--rows", help="Rows, e.g. 2 or 1,2,8.")],
    kind: Annotated[str | None, typer.Option("--kind", "-k", help="Kinds (default: every kind with kernels).")] = None,
    model: Annotated[str, typer.Option("--model", "-m", help="Model.")] = "glm53_flash",
    context: Annotated[
        int | None,
        typer.Option(
            "--context",
            min=0,
            help="Tokens cached before the step (row r: r*3 fewer) for the kinds that read caches (sparse); "
            "default: the check's contexts.",
        ),
    ] = None,
    trials: Annotated[int, typer.Option("--trials", min=1, help="Finished trials per study (all runs together).")] = 30,
    space: Annotated[
        str | None, typer.Option("--space", metavar="KNOB,...", help="Search only these knobs (default: all).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            metavar="URL",
            help="Optuna storage: sqlite:///path.db (its folder must exist), postgresql://user@host/db (pip install "
            "'glm53ctl[postgres]'), or a journal file path.log; default sqlite:///build/tune/studies.db.",
        ),
    ] = None,
    study: Annotated[
        str | None, typer.Option("--study", metavar="NAME", help="Study name (default: per key, space and code).")
    ] = None,
    search_only: Annotated[
        bool, typer.Option("--search-only", help="A worker: add trials to the shared study, decide nothing.")
    ] = False,
    top: Annotated[int, typer.Option("--top", min=1, help="Best trials re-measured against the default.")] = 3,
    rounds: Annotated[int, typer.Option("--rounds", min=3, help="A B B A rounds per comparison.")] = 15,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sampler and of the inputs.")] = 0,
    write: Annotated[
        bool, typer.Option("--write", help="Write configs/tuned/<model>/tp<T>.json and a CHANGELOG line.")
    ] = False,
    plots: Annotated[
        Path | None, typer.Option("--plots", metavar="DIR", help="The study's history and knob importances (PNG).")
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Processes compiling a small space's points first (default: cores - 2).")
    ] = 0,
    cache: KernelCacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Results as JSON on stdout.")] = False,
) -> None:
    """Search each key's knobs with Optuna; keep a knob only where it measures faster (docs/knobs.md)."""

    kinds = parse_list("--kind", kind, selectable_kinds(), default=kernel_kinds())
    refuse_steps(kinds, "tune")
    tps = parse_list("--tp", tp, TP_WIDTHS, int)
    rowss = parse_list("--rows", rows, ROW_COUNTS, int, default=ROWS)
    spec = load_model(model)
    for t in tps:
        spec.check_tp(t)
    names = [n.strip() for n in space.split(",") if n.strip()] if space else None

    spaces = {k: space_of(kind_knobs(k), names) for k in kinds}
    context_applies(kinds, context is not None)
    ctx = {k: context_of(k, context) for k in kinds}
    if context is not None:
        context_fits(spec, [k for k in kinds if ctx[k] is not None], rowss, [context])  # positions
    if study and len(kinds) * len(tps) * len(rowss) > 1:
        raise UsageError("--study names one study: give one --kind, --tp and --rows with it")
    if write and search_only:
        raise UsageError("--write and --search-only: a worker decides nothing, so writes nothing")
    if plots is not None:
        _plot_folder_ok(plots)

    url = storage or DEFAULT_STORAGE
    plot_only = plots is not None and not gpu_count()  # the studies a GPU ran, plotted here from their storage
    check_storage(url, create=not plot_only)  # before anything is opened or made, and before the GPU's check
    command = "glm53ctl " + shlex.join(sys.argv[1:])  # as typed, whether run as glm53ctl or python -m glm53ctl

    if plot_only:
        code = measure.code_digest(folders=("kernels",))  # a study's trials stand while the kernels do
        store = tuning.storage_of(url, create=False)  # read only: a failed --plots leaves nothing behind

        names = [
            study
            or tuning.study_name(
                model, k, t, r, spaces[k], code, ctx[k], tuning.base_of(resolve_key(model, k, t, r), spaces[k])
            )
            for k in kinds
            for t in tps
            for r in rowss
        ]
        studies = [_load_study(store, name, url) for name in names]  # every one there before anything is drawn
        for s in studies:
            _plots(s, plots)
        return
    environment_ok()

    with counted_compiles(cache) as compiles:  # every key's kernels loaded or compiled, its trials' included
        store = tuning.storage_of(url)
        if plots is not None:
            _plot_folder(plots)  # before the search: a folder that cannot be made fails now, not after it

        keys = {}  # each resolved once, what its lookup said printed once (a trial is the key with its knobs)
        for k, t, r in [(k, t, r) for k in kinds for t in tps for r in rowss]:
            keys[k, t, r] = key = resolve_key(model, k, t, r, None, "cuda", ctx[k])
            for w in key.warnings:
                print_warning(w)
        _precompile(keys, spaces, trials, jobs)
        measure.warm_clocks()
        weights = Weights(spec, seed=0, device="cuda")
        code = measure.code_digest(folders=("kernels",))  # a study's trials stand while the kernels do
        results = []
        for k in kinds:
            for t in tps:
                for r in rowss:
                    where = f"at TP{t} rows {r}" + (f" context {ctx[k]}" if ctx[k] is not None else "")
                    base = tuning.base_of(keys[k, t, r], spaces[k])  # the key's tuned knobs outside the space
                    name = study or tuning.study_name(model, k, t, r, spaces[k], code, ctx[k], base)
                    held = f", holding {', '.join(f'{n}={v}' for n, v in base.items())}" if base else ""
                    err_console.print(f"tune {k} {where}: study {name} ({shown(url)}){held}")
                    ev = tuning.GpuEvaluator(weights, keys[k, t, r], seed=seed, base=base)
                    with counting(keys[k, t, r].name):
                        s = tuning.search(
                            ev, ev.default, spaces[k], store, name, trials, seed, on_trial=_progress(trials)
                        )
                    if plots is not None:
                        _plots(s, plots)
                    if search_only:
                        continue
                    with counting(keys[k, t, r].name):
                        res = tuning.decide(ev, s, ev.default, spaces[k], top, rounds, where)
                    for d in res.decisions:
                        err_console.print(escape(f"  {d.reason}"))
                    key = {"kind": k, "tp": t, "rows": r} | ({"context": ctx[k]} if ctx[k] is not None else {})
                    results.append(
                        key
                        | {"storage": shown(url), "space": list(spaces[k]), "base": base}
                        | res.to_json()
                        | {"kernels_of": keys[k, t, r].name}
                    )
                    del ev
        counts = compiles()
        for res_ in results:
            res_["kernels"] = counts.get(res_.pop("kernels_of"), Counts()).as_dict()
        if search_only:
            print_kernels(Output(as_json), counts)
            return
        env = measure.environment(command, study=study, seed=seed)
        if write:
            written, warnings = write_results(model, results, env)
            for w in warnings:
                print_warning(w)
            for path in written:
                err_console.print(f"wrote {path}")
        o = Output(as_json)
        o.json({"environment": env, "code_digest": code, "model": model, "keys": results})
        print_table(o, model, results)
        print_kernels(o, counts)


COLUMNS = ["key", "trials", "kept", "µs: default → tuned\nratio [95% CI]", "dropped: µs change\n(why: --json)"]


def print_table(o: Output, model: str, results: list[dict]) -> None:
    """The results, a row per key, readable at 100 columns: the knobs kept and dropped one per line, each dropped
    one with its change of the µs in a few words (the whole reason is in --json and in the tuned file)."""
    o.table(f"tune {model}", COLUMNS, [_row(r) for r in results])


def _precompile(keys: dict, spaces, trials: int, jobs: int) -> None:
    """Where a key's space is small enough to be searched whole, every point's kernels compiled first, in
    parallel (tuning/bench.py precompile); a TPE search compiles as it goes."""
    import itertools
    import math

    todo = []
    for k in dict.fromkeys(kind for kind, _, _ in keys):
        space = spaces[k]
        if math.prod(len(v) for v in space.values()) > trials:
            continue
        for point in itertools.product(*space.values()):
            knobs = dict(zip(space, point, strict=True))
            todo += [  # as the search runs it: the key's held knobs too
                (key.with_knobs(defaults(k) | base_of(key, space) | knobs), ())
                for (kind, _, _), key in keys.items()
                if kind == k
            ]
    precompile(todo, jobs or compile_workers(), err_console.print)


def _row(r: dict) -> list:

    e = r["evidence"]
    kept = "\n".join(f"{n}={v}" for n, v in r["kept"].items()) or "defaults"
    if e:  # the kept set against the default in one A B B A run: the µs and the ratio of the same rounds
        lo, hi = e["ratio_ci"]
        us = f"{e['default_us']:.1f} → {e['chosen_us']:.1f}\n{e['ratio']:.3f} [{lo:.3f}, {hi:.3f}]"
    else:
        us = f"{r['default_us']:.1f}" if r["default_us"] else "-"
    dropped = "\n".join(_dropped(d) for d in r["decisions"] if not d["kept"]) or "-"
    t = r["trials"]
    trials = f"{t['complete']} timed\n{t['rejected']} rejected\n{t['same_launch']} same launch"
    return [key_label(r).replace(" ", "\n", 1), trials, kept, us, dropped]


def _dropped(d: dict) -> str:
    """A dropped knob in a few words, its change of the µs: `grid=132 +3.0% search` (timed alone in the search,
    slower), `box_words=16 +1.8%` (re-measured, slower), `kda_split=2 -0.2% noise` (within the noise),
    `chain=1 same launch`."""
    reason, ratio = d["reason"], d.get("ratio")
    if ratio is None:
        return f"{d['knob']}={d['value']} " + ("same launch" if "the same launch" in reason else "dropped")
    why = f"{(ratio - 1) * 100:+.1f}%"
    if "not beyond δ" in reason:
        why += " together: noise"
    elif "within the noise" in reason:
        why += " noise"
    elif "in the search" in reason:
        why += " search"
    return f"{d['knob']}={d['value']} {why}"


def _progress(trials: int):
    def report(study, trial) -> None:
        from optuna.trial import TrialState
        from rich.markup import escape

        what = f"{trial.value:.1f} us" if trial.state == TrialState.COMPLETE else trial.user_attrs.get("rejected", "")
        if "same_as" in trial.user_attrs:
            what += f" (the launch of trial {trial.user_attrs['same_as']})"
        try:
            best = f"best {study.best_value:.1f} us (trial {study.best_trial.number})"
        except ValueError:
            best = "no trial timed yet"
        params = ", ".join(f"{n}={v}" for n, v in trial.params.items())
        err_console.print(escape(f"  trial {trial.number + 1}/{trials} [{params}]: {what}; {best}"))

    return report


def _load_study(store, name: str, url: str):
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=store)
    except KeyError:
        names = ", ".join(optuna.get_all_study_names(store)) or "none"
        raise UsageError(f"no study {name!r} in {url}", hint=f"its studies: {names} (--study NAME picks one)") from None


def _plot_folder_ok(folder: Path) -> None:
    """--plots DIR, before anything is read or made: a folder (or a place one can be made) that is writable."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--plots {folder}: a file, not a folder", hint="give a folder's path (made if missing)")
    there = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not there.is_dir():
        raise UsageError(f"--plots {folder}: {there} is a file, not a folder", hint="give a folder's path")
    if not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(
            f"--plots {folder}: cannot write in {there} (read-only)", hint="give --plots a folder you can write to"
        )


def _plot_folder(folder: Path) -> None:
    """Make --plots DIR (and its parents); UsageError naming it where that fails (a read-only place)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"--plots {folder}: cannot make the folder: {e.strerror or e}",
            hint="give --plots a folder you can write to",
        ) from None


def _plots(study, folder: Path) -> None:
    """The study's history and the knobs' importances as PNG files (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from optuna.visualization import matplotlib as plot
    except ImportError:
        raise UsageError("--plots needs matplotlib", hint="pip install matplotlib") from None
    import warnings

    _plot_folder(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
        for what, draw in (("history", plot.plot_optimization_history), ("importances", plot.plot_param_importances)):
            try:
                ax = draw(study)
            except (ValueError, RuntimeError) as e:  # importances need two knobs and trials that vary them
                print_warning(f"--plots: no {what} plot for {study.study_name}: {e}")
                continue
            if what == "history":
                ax.set_ylabel("µs per launch (median of the trial's replays)")
            path = folder / f"{study.study_name}-{what}.png"
            try:
                ax.figure.savefig(path, dpi=110, bbox_inches="tight")
            except OSError as e:
                raise UsageError(
                    f"--plots {folder}: cannot write {path}: {e.strerror or e}",
                    hint="give --plots a folder you can write to",
                ) from None
            finally:
                matplotlib.pyplot.close(ax.figure)
            err_console.print(f"plotted {path}")
