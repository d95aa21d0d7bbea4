"""Knobs (docs/design.md §5): the lookup of a kind's knobs, and the one resolver of a key (`resolve_key`).

A kind declares its own knobs beside it (`kernels/kinds/<kind>/__init__.py`) and names the runtime knobs it
takes in the kind registry (`kernels/kinds/__init__.py`), with its own defaults where they differ; `Knob` and the
runtime's knobs are defined in the registry's leaf (`kernels/kinds/base.py`) and re-exported here.
`schedule` knobs must leave every output and every write bitwise equal to the default; `numeric` knobs
must stay within the reference tolerance. Kernels contain no tuned numbers: a command resolves each key once
(`resolve_key`: defaults, then the tuned config, then overrides) and hands the harness the resolved key.
"""

from __future__ import annotations

import sys

from glm53ctl import tuned
from glm53ctl.errors import UsageError
from glm53ctl.kernels.key import ResolvedKey, resolve_grid
from glm53ctl.kernels.kinds import get_kind
from glm53ctl.kernels.kinds.base import RUNTIME_KNOBS, Knob, KnobClass
from glm53ctl.kernels.kinds.fits import check_runs
from glm53ctl.kernels.spec import load_model
from glm53ctl.paths import tuned_path

__all__ = [
    "RUNTIME_KNOBS",
    "Knob",
    "KnobClass",
    "ResolvedKey",
    "check_knobs",
    "defaults",
    "kind_knobs",
    "parse_knobs",
    "resolve_grid",
    "resolve_key",
]


def kind_knobs(kind: str) -> dict[str, Knob]:
    """Every knob of a kind, by name: the runtime knobs it takes (with its defaults), then its own."""

    return get_kind(kind).all_knobs()


def defaults(kind: str) -> dict[str, object]:
    return {name: k.default for name, k in kind_knobs(kind).items()}


def check_knobs(kind: str, knobs: dict) -> None:

    known = kind_knobs(kind)
    for name, value in knobs.items():
        k = known.get(name)
        if k is None:
            raise UsageError(
                f"knob {name!r} does not apply to {kind}", hint=f"{kind} knobs: {', '.join(defaults(kind))}"
            )
        if name != "grid" and value not in k.values:
            raise UsageError(f"knob {name}={value!r}: expected one of {', '.join(map(str, k.values))}")


def resolve_key(
    model: str,
    kind: str,
    tp: int,
    rows: int,
    overrides: dict | None = None,
    device=None,
    context: int | None = None,
    context_warned: bool = False,
) -> ResolvedKey:
    """One key as a command starts it (docs/design.md §6): the registry's defaults, then the tuned entry of
    configs/tuned/<model>/tp<T>.json for (kind, rows) if there is one, then explicit overrides; the grid resolved
    for `device` (None: left 0, a build's); for a composite kind, each part kind's own key (a grid given handed
    to every part). Nothing is printed: the key carries the lookup's warnings (an entry measured on another GPU
    capability or Triton minor version; with `context_warned`, for a kind that reads caches, an entry tuned at
    another context than `context`, None being the check's contexts) and the command prints them once."""

    entry, spec = get_kind(kind), load_model(model)  # a model by name or by its .toml's path: its name's file
    check_runs(spec, kind, tp)  # a model the kernels cannot run: exit 2 before anything is built or launched
    knobs, source, said = _tuned(spec.name, kind, tp, rows, entry.defaults(), device, context, context_warned)
    knobs = {**knobs, **(overrides or {})}
    check_knobs(kind, knobs)
    handed = {n: v for n, v in (overrides or {}).items() if n == "grid"}  # a step's grid is every part's
    if knobs.get("launch", "parts") != "parts" and entry.parts:  # and so is its launch, unless "parts"
        handed["launch"] = knobs["launch"]
    parts = tuple(resolve_key(model, p, tp, rows, handed, device) for p in entry.parts)
    return ResolvedKey(
        model=model,
        kind=kind,
        tp=tp,
        rows=rows,
        context=context if entry.reads_context else None,
        device=None if device is None else str(device),
        streams=spec.mhc.streams,
        knobs=entry.record(**resolve_grid(knobs, device)),
        source=source,
        warnings=tuple(said) + tuple(w for p in parts for w in p.warnings),
        bound_items=tuple(entry.bounds.items()),
        parts=parts,
    )


def _tuned(model, kind, tp, rows, knobs, device, context, context_warned) -> tuple[dict, str, list[str]]:
    """The tuned entry over the defaults, its source and what to warn of (each line naming the file)."""

    path = tuned_path(model, tp)
    if not path.exists():
        return knobs, "defaults", []
    cap = triton_version = None
    if device is not None and str(device).startswith("cuda"):
        import torch
        import triton

        major, minor = torch.cuda.get_device_capability(device)
        cap, triton_version = f"{major}.{minor}", triton.__version__
    cfg = tuned.load(path)
    knobs, source, warnings = tuned.lookup(cfg, kind, rows, knobs, cap, triton_version)
    if context_warned and get_kind(kind).reads_context:
        warnings = warnings + tuned.context_warnings(cfg, kind, rows, context)
    return knobs, source, [f"{path}: {kind} rows={rows}: {w}" for w in warnings]


def parse_knobs(text: str | None, kind: str) -> dict:
    """`--knobs name=value,...` as a kind's typed knob values ("4" is the int 4 where the knob's values are
    ints); an unknown knob or value is a usage error naming what the kind takes."""

    if not text:
        return {}
    known = kind_knobs(kind)
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, eq, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not eq or not name or not raw:
            raise UsageError(f"--knobs {text!r}: expected name=value pairs, comma-separated (e.g. oproj_first=1)")
        k = known.get(name)
        if k is None:
            raise UsageError(f"knob {name!r} does not apply to {kind}", hint=f"{kind} knobs: {', '.join(known)}")
        if name == "grid":
            if not raw.isdigit():
                raise UsageError(f"knob grid={raw!r}: expected a program count (0: three per SM)")
            out[name] = int(raw)
            continue
        match = [v for v in k.values if str(v) == raw]
        if not match:
            raise UsageError(f"knob {name}={raw!r}: expected one of {', '.join(map(str, k.values))}")
        out[name] = match[0]
    return out


def legacy_key(model: str, kind: str, tp: int, rows: int, knobs: dict | None, device, context=None) -> ResolvedKey:
    """A key resolved as a command resolves it, for the callers that pass (kind, tp, rows, knobs, device) as before
    resolved keys (`bench`'s `time_key`, the tune evaluator's older form); prints the lookup's warnings."""
    key = resolve_key(model, kind, tp, rows, knobs, device, context)
    for w in key.warnings:
        print(f"Warning: {w}", file=sys.stderr)
    return key
