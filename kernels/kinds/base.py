"""What a kind and a knob are (docs/design.md §2, §5): the registry's definitions, a leaf that imports nothing of
the project, so that the registry, the tuned files and the commands read them for no torch and no circle.

A `Kind` names its harness, its reference run and (where it has them) its real-rank launches by where they are,
`"module:attribute"` (as a package's entry points do): importing the registry loads none of them (no torch), and
`Kind.load_harness()` and the others import the one asked for. None of those modules imports the registry's
module back for its own sake: the kinds' code sits below the registry (the layers contract, pyproject.toml).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import namedtuple
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import ClassVar, Literal

KnobClass = Literal["schedule", "numeric"]


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    values: tuple
    default: object
    cls: KnobClass
    help: str
    # the layer kernel's code reads it as it is: it travels in the launch's constexprs whole, with every such knob
    # of its kind (`KnobRecord.code()`, the kernel's `sched.KNOB.<name>`), and needs no field of its own elsewhere
    code: bool = False


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


class KnobRecord(Mapping):
    """The knobs in force at a key: one typed field per knob of its kind (`Kind.record`, a frozen dataclass made
    from the kind's declarations), read by name as attributes (`knobs.block_k`). It is also a read-only mapping,
    for the code that goes over every knob whatever it is (labels, config files, JSON), and equal to a dict of
    the same items. `replace(**changes)` is the same record with other values; a value of another type than the
    knob's default is refused when the record is made."""

    DECLARED: ClassVar[dict[str, Knob]] = {}
    CODE: ClassVar[type] = namedtuple("NoKnobs", [])  # its kind's `code` knobs' named tuple

    def __post_init__(self) -> None:
        for name, knob in self.DECLARED.items():
            value = getattr(self, name)
            if not isinstance(value, type(knob.default)) or isinstance(value, bool) != isinstance(knob.default, bool):
                raise TypeError(f"knob {name}={value!r}: expected {type(knob.default).__name__}")

    def __getitem__(self, name: str):
        if name not in self.DECLARED:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(self.DECLARED)

    def __len__(self) -> int:
        return len(self.DECLARED)

    def __hash__(self) -> int:
        return hash(tuple(self.items()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={v!r}' for n, v in self.items())})"

    def replace(self, **changes) -> KnobRecord:
        return dataclasses.replace(self, **changes)

    def code(self) -> tuple:
        """The knobs the kernel's code reads as they are (`Knob.code`), as a named tuple: a constexpr the layer
        kernel gets whole (`sched.KNOB`), each read by name in the body that acts on it."""
        return self.CODE(*(getattr(self, n) for n in self.CODE._fields))

    def __reduce__(self):  # pickled by kind (worker and rank processes are sent keys): its class is made at run time
        return (_knob_record, (self.KIND, dict(self)))


def knob_record(kind: str, knobs: dict[str, Knob]) -> type[KnobRecord]:
    """A kind's knob record class: a frozen dataclass with one field per knob, typed as its default, defaulting to
    it (the kind's default for a runtime knob)."""

    fields = [(n, type(k.default), dataclasses.field(default=k.default)) for n, k in knobs.items()]
    name = "".join(p.capitalize() for p in kind.split("_")) + "Knobs"
    cls = dataclasses.make_dataclass(
        name, fields, bases=(KnobRecord,), frozen=True, eq=False, namespace={"__hash__": KnobRecord.__hash__}
    )
    cls.DECLARED, cls.KIND, cls.__module__ = dict(knobs), kind, __name__
    cls.CODE = namedtuple(name + "Code", [n for n, k in knobs.items() if k.code])
    return cls


def _knob_record(kind: str, values: dict) -> KnobRecord:
    """A record unpickled: its kind's record class from the registry (which every process can import)."""
    return importlib.import_module("glm53ctl.kernels.kinds").get_kind(kind).record(**values)


LAUNCH = Knob(
    "launch",
    ("persistent", "stages"),
    "persistent",
    "schedule",
    "one persistent launch whose programs claim the tasks and hand off inside it (persistent), or one launch per "
    "stage, a program per task, chained by programmatic dependent launch: each program lets the next launch "
    "start, issues its weight tile, then waits for the launch before it (stages); the same bits",
)


STAGE_CODE = Knob(
    "stage_code",
    ("shared", "own"),
    "shared",
    "schedule",
    "with launch=stages: every stage launches the layer kernel built for every task type (shared), or a kernel "
    "built for the stage's own task types alone (own: fewer registers and less shared memory, more programs "
    "resident, each stage a kernel of its own to load); the same bits",
)


def _empty() -> MappingProxyType:
    return MappingProxyType({})


@dataclass(frozen=True)
class Kind:
    """One launch kind as every command reads it. `harness`, `reference` and `ranks` say where things are,
    `"module:attribute"` (module doc): `harness`, the kind's `KindHarness` class (None: no kernels yet);
    `reference`, the function that runs its reference (`glm53ctl run`: `fn(ref, key)`); `ranks`, what one rank's
    process runs with real ranks."""

    name: str
    summary: str
    reference: str
    harness: str | None = None
    layer: tuple[str, str] | None = None  # a layer kind's (attention, FFN) shape (kernels/spec.py)
    takes_tokens: bool = False  # its input is token ids (else the streams H)
    reads_context: bool = False  # it reads caches that grow with the context (`--context` sizes them)
    # a step of other kinds' launches (`model`): selected by name only (its parts are checked as their kinds);
    # `parts`, the kinds whose launches make it (each part gets its own resolved key)
    composite: bool = False
    parts: tuple[str, ...] = ()
    bounds: MappingProxyType = field(default_factory=_empty)
    knobs: tuple = ()  # its own knobs
    runtime: tuple[str, ...] = ()  # the runtime's knobs it takes (RUNTIME_KNOBS)
    runtime_defaults: MappingProxyType = field(default_factory=_empty)
    # `fn(group, key, inputs, mute, budget_ns)` -> per launch its outputs or its fault in words
    # (kernels/runtime/ranks.py); None: the kind runs on one device only (its peers emulated) so far
    ranks: str | None = None
    colour: str = "#dd8452"  # its segments in a step's picture (bench --save)
    dims: tuple = ()  # what its kernels need of a model's dimensions (kinds/dims.py `Dim`)

    @property
    def has_kernels(self) -> bool:
        return self.harness is not None

    def load_harness(self) -> type:
        return load(self.harness)

    def load_reference(self) -> Callable:
        return load(self.reference)

    def load_ranks(self) -> Callable:
        return load(self.ranks)

    def all_knobs(self) -> dict[str, Knob]:
        """Every knob of the kind, by name: the runtime knobs it takes (with its defaults), then its own."""
        shared = {n: RUNTIME_KNOBS[n] for n in self.runtime}
        shared = {n: replace(k, default=self.runtime_defaults.get(n, k.default)) for n, k in shared.items()}
        return shared | {k.name: k for k in self.knobs}

    def defaults(self) -> dict[str, object]:
        return {name: k.default for name, k in self.all_knobs().items()}

    @cached_property
    def record(self) -> type[KnobRecord]:
        """Its knobs as a typed record class (`KnobRecord`); `record()` holds the defaults."""
        return knob_record(self.name, self.all_knobs())


def load(where: str):
    """The attribute a `"module:attribute"` names, its module imported."""
    module, _, attr = where.partition(":")
    return getattr(importlib.import_module(module), attr)


def facts(module) -> dict:
    """A kind folder's facts (its __init__.py: KNOBS, RUNTIME, RUNTIME_DEFAULTS, BOUNDS; LAYER for a layer kind; DIMS
    where its kernels need more of a model than TP sharding) as `Kind` fields."""
    return {
        "layer": getattr(module, "LAYER", None),
        "knobs": module.KNOBS,
        "runtime": module.RUNTIME,
        "runtime_defaults": MappingProxyType(module.RUNTIME_DEFAULTS),
        "bounds": MappingProxyType(module.BOUNDS),
        "dims": getattr(module, "DIMS", ()),
    }
