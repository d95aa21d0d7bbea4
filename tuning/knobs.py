"""Knobs (docs/design.md §5): the runtime's shared knobs, declared once here, and the lookup of a kind's knobs.

A kind declares its own knobs beside it (`kernels/kinds/<kind>/__init__.py`) and names the runtime knobs it
takes in the kind registry (`kernels/kinds/__init__.py`), with its own defaults where they differ.
`schedule` knobs must leave every output and every write bitwise equal to the default; `numeric` knobs
must stay within the reference tolerance. Kernels contain no tuned numbers: a launch gets its knobs
from `knobs_for` (defaults, then the tuned config).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

KnobClass = Literal["schedule", "numeric"]


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    values: tuple
    default: object
    cls: KnobClass
    help: str


# The runtime's knobs, shared by the kinds (grid 0: three programs per SM on a GPU, 4 programs in the
# interpreter). A kind's own defaults, where its measurements chose another value, are in its registry entry.
RUNTIME_KNOBS = {
    k.name: k
    for k in (
        Knob("grid", (0, 132, 264, 396), 0, "schedule", "programs in the persistent grid"),
        # warps: the layout of a tl.sum's operands, so its reduction order (dense's gates and KDA heads differ in
        # the last bit at 8 warps on the H200, docs/perf/dense.md): numeric
        Knob("warps", (4, 8), 4, "numeric", "warps per program"),
        Knob(
            "handoff",
            ("flag", "box"),
            "box",
            "schedule",
            "broadcast hand-off: one flag word per producer, or per-consumer 128-byte box lines",
        ),
        Knob(
            "poll",
            (0, 1, 2),
            1,
            "schedule",
            "0: every thread polls with ld.acquire.gpu; 1: relaxed polls (+64 ns sleep), then one acquire; "
            "2: as 1 with 512 ns sleeps (less traffic from many waiters); the clock and abort word every 8th poll",
        ),
        Knob("stages", (1, 2, 3, 4, 6, 8), 4, "schedule", "software-pipelining depth of the GEMV's K loop"),
    )
}


def kind_knobs(kind: str) -> dict[str, Knob]:
    """Every knob of a kind, by name: the runtime knobs it takes (with its defaults), then its own."""
    from glm53ctl.kernels.kinds import get_kind

    k = get_kind(kind)
    shared = {n: RUNTIME_KNOBS[n] for n in k.runtime}
    shared = {n: replace(knob, default=k.runtime_defaults.get(n, knob.default)) for n, knob in shared.items()}
    return shared | {knob.name: knob for knob in k.knobs}


def defaults(kind: str) -> dict[str, object]:
    return {name: k.default for name, k in kind_knobs(kind).items()}


def resolve_grid(knobs: dict, device) -> dict:
    """grid 0 -> three programs per SM (4 in the interpreter, which runs programs one after another)."""
    import torch

    knobs = dict(knobs)
    if knobs.get("grid", 1) == 0:
        dev = torch.device(device)
        knobs["grid"] = 3 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    return knobs


def check_knobs(kind: str, knobs: dict) -> None:
    from glm53ctl.errors import UsageError

    known = kind_knobs(kind)
    for name, value in knobs.items():
        k = known.get(name)
        if k is None:
            raise UsageError(
                f"knob {name!r} does not apply to {kind}", hint=f"{kind} knobs: {', '.join(defaults(kind))}"
            )
        if name != "grid" and value not in k.values:
            raise UsageError(f"knob {name}={value!r}: expected one of {', '.join(map(str, k.values))}")


def knobs_for(model: str, kind: str, tp: int, rows: int, overrides: dict | None = None, device=None) -> dict:
    """The knobs in force for one build key (docs/design.md §6): the registry's defaults, then the tuned entry of
    configs/tuned/<model>/tp<T>.json for (kind, rows) if there is one, then explicit overrides. A tuned
    entry measured on another GPU capability or Triton minor version is used with a warning."""
    from glm53ctl import tuned
    from glm53ctl.output import print_warning
    from glm53ctl.paths import tuned_path

    knobs = defaults(kind)
    path = tuned_path(model, tp)
    if path.exists():
        cap = triton_version = None
        if device is not None and str(device).startswith("cuda"):
            import torch
            import triton

            major, minor = torch.cuda.get_device_capability(device)
            cap, triton_version = f"{major}.{minor}", triton.__version__
        knobs, _, warnings = tuned.lookup(tuned.load(path), kind, rows, knobs, cap, triton_version)
        for w in warnings:
            print_warning(f"{path}: {kind} rows={rows}: {w}")
    knobs = {**knobs, **(overrides or {})}
    check_knobs(kind, knobs)
    return knobs


def warn_of_context(model: str, kind: str, tp: int, rows: int, context: int | None) -> None:
    """Once per key a command runs (check, bench) of a kind that reads caches, at `context` (None: the check's
    contexts): a warning when its tuned entry was measured at another context."""
    from glm53ctl import tuned
    from glm53ctl.kernels.kinds import get_kind
    from glm53ctl.output import print_warning
    from glm53ctl.paths import tuned_path

    path = tuned_path(model, tp)
    if get_kind(kind).reads_context and path.exists():
        for w in tuned.context_warnings(tuned.load(path), kind, rows, context):
            print_warning(f"{path}: {kind} rows={rows}: {w}")


def parse_knobs(text: str | None, kind: str) -> dict:
    """`--knobs name=value,...` as a kind's typed knob values ("4" is the int 4 where the knob's values are
    ints); an unknown knob or value is a usage error naming what the kind takes."""
    from glm53ctl.errors import UsageError

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
