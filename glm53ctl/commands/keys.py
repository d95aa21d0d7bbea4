"""What the commands that take keys share about them beyond `parse_list`: which kinds `--context` applies to,
the context a kind's keys run at, and the kinds that time and tune cannot take yet."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl.errors import UsageError
from glm53ctl.kernels import kernel_cache
from glm53ctl.kernels.kernel_cache import Counts
from glm53ctl.kernels.kinds import context_kinds, get_kind
from glm53ctl.kernels.sizes import check_fits, check_positions, launch_needs
from glm53ctl.kernels.spec import TP_WIDTHS
from glm53ctl.output import print_warning


def context_applies(kinds: list[str], given: bool) -> list[str]:
    """The selected kinds that read caches (`--context` sizes them); refused when it is given and none does."""

    readers = [k for k in kinds if k in context_kinds()]
    if given and not readers:
        raise UsageError(
            f"--context applies to the kinds that read caches ({', '.join(context_kinds())}), not to {', '.join(kinds)}"
        )
    return readers


def parse_contexts(text: str) -> list[int]:
    """--context N,...: token counts, 0 or more (bench and build take several)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise UsageError(f"--context {text!r}: expected a comma-separated list of token counts, 0 or more")
    return values


def context_of(kind: str, context: int | None) -> int | None:
    """The context a key of `kind` runs at: the one given, for a kind that reads caches; else None."""

    return context if get_kind(kind).reads_context else None


def context_fits(spec, kinds: list[str], rowss: list[int], contexts: list[int], device: str | None = None) -> None:
    """Each --context within the model's positions (kernels/sizes.py); with `device`, each key's caches within
    the memory there and on the host, before a task table or a cache of that size is made."""

    for c in contexts:
        check_positions(spec, c)
    if device is None:
        return
    for k in kinds:
        for r in rowss:
            for c in contexts:
                check_fits(
                    f"{k} rows {r} at context {c:,}",
                    launch_needs(spec, k, r, c, 1, device),
                    device,
                    hint="a smaller --context or fewer --rows",
                )


def refuse_steps(kinds: list[str], verb: str) -> None:
    """A step of many launches (`model`) is not tuned (its parts are, as their kinds; bench times its `chain`
    knob beside it): a clear error, not a traceback."""

    steps = [k for k in kinds if get_kind(k).composite]
    if steps:
        raise UsageError(
            f"{verb} of {', '.join(steps)}: a whole step is not tuned (its parts are: {verb} their kinds; "
            "bench --kind model times its chain knob beside the step)",
            hint="glm53ctl tune --kind dense,kda,sparse,tail",
        )


# what a whole step (`model`) is timed beside: its parts' own baselines are their kinds' (bench them)
STEP_BASELINES = ("torch", "compile", "persistent", "stages", "chain")


def refuse_step_baselines(kinds: list[str], baselines: list[str]) -> None:

    steps = [k for k in kinds if get_kind(k).composite]
    if "chain" in baselines and len(steps) < len(kinds):
        raise UsageError(
            "--baseline chain: a step's (the other value of model's knob chain); a kind's launch has no chain",
            hint="glm53ctl bench --kind model --baseline chain",
        )
    other = [b for b in baselines if b not in STEP_BASELINES]
    if steps and other:
        raise UsageError(
            f"--baseline {','.join(other)}: not for {', '.join(steps)} (a step is timed beside "
            f"{', '.join(STEP_BASELINES)}; its parts' launches beside theirs as their kinds)",
            hint="glm53ctl bench --kind dense,kda,sparse,tail --baseline separate",
        )


def ranks_width(gpus: int) -> None:
    """--gpus N (N > 1) of check, fault, run and bench: one rank per GPU, so N is a TP width."""

    if gpus not in TP_WIDTHS:
        raise UsageError(f"--gpus {gpus}: one rank per GPU at a TP width ({', '.join(map(str, TP_WIDTHS))})")


KernelCacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--cache",
        metavar="DIR",
        envvar="GLM53CTL_KERNEL_CACHE",
        help="A kernel cache `glm53ctl build` wrote (build/kernels, carried from a CPU machine): on a GPU, kernels "
        "whose key matches load instead of compiling.",
    ),
]


@contextlib.contextmanager
def counted_compiles(cache):
    """Around a command's launches: --cache DIR in use (exit 2 unless it is one) and every key's compiles and loads
    counted, this process's and its workers'; yields a function that gives them (kernel_cache.Counts by key)."""

    use_kernel_cache(cache)
    with kernel_cache.tallied() as so_far:
        yield so_far


def attach_kernels(rows: list[dict], counts: dict) -> None:
    """Each result row (its "key" a key's name) gets what its launches loaded and compiled (JSON: "kernels")."""

    for r in rows:
        r["kernels"] = counts.get(r["key"], Counts()).as_dict()


def use_kernel_cache(cache) -> None:
    """--cache DIR (or $GLM53CTL_KERNEL_CACHE) of a command that launches: exit 2 unless DIR is a kernel cache
    `glm53ctl build` wrote; then its kernels load where their keys match (kernels/kernel_cache.py). Compiles are
    counted per key either way."""
    import os

    root = kernel_cache.open_cache(cache) if cache is not None else None
    if root is not None and os.environ.get("TRITON_INTERPRET") == "1":
        print_warning(f"--cache {cache}: the interpreter compiles nothing, so it loads nothing from a kernel cache")
    kernel_cache.activate(root)


def kernel_rows(counts: dict) -> list[tuple]:
    """The table's rows of what each key's launches loaded and compiled (kernel_cache.Counts by key name)."""
    return [
        (label, c.loaded, c.reused, c.compiled, f"{c.compile_s:.1f}", "; ".join(c.misses) or "")
        for label, c in sorted(counts.items())
    ]


KERNEL_COLUMNS = ["key", "loaded", "this machine's cache", "compiled", "compile s", "why compiled (a carried cache)"]


def print_kernels(o, counts: dict) -> None:
    """Per key, the kernels loaded from the carried cache, found in this machine's Triton cache, and compiled with
    their seconds; nothing where nothing was compiled or loaded (the interpreter)."""
    counts = {k: c for k, c in counts.items() if c.loaded or c.reused or c.compiled}
    if counts and not o.as_json:
        o.table("kernels", KERNEL_COLUMNS, kernel_rows(counts))
