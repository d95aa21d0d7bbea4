"""Task types: what a row of a task table is, and the one id space every kind's tables share.

A task is a small typed record (`Task`): its type's id, its name (what a trace or a LaunchFault shows) and up to
three named fields, which it serializes into its table row (`row()`: the id, then the fields in order). Each op
declares the task types it contributes in its folder (`kernels/ops/<op>/tasks.py`); the device code unpacks a row
once, naming the fields as its record does (`n0, ks = fields(row, GU)`: the one function here that reads a row's
fields, as many as the type declares); a kind composes ops' tasks into its table (`TaskTable.add(task)`), and the
runtime knows task rows, not kinds.

One id space across kinds lets one table hold tasks of several kinds (the whole step: embed, the layers, the
tail) and lets a trace or a fault name a task without knowing which launch it came from. Ids are never reused: a
new type takes the next free one (`next_id()`), and an id is a constant in the kernel's code, whose value can
change the code: `embed`'s branch on its gather type compiled to other code as `ttype == 1` than as `ttype == 0`
(8 fewer registers, and on the H200 8.0 µs against 7.1 at TP8 rows 1, docs/perf/embed.md). Embed keeps 0 and 1,
the ids it was measured with; a kind's ids changed is a change to time (`build --against` shows whether its code
changed at all).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import triton
import triton.language as tl

from glm53ctl.kernels.tlx import interpreting  # noqa: F401 (importing tlx applies the interpreter's settings)

# id -> the task type's class, filled as each type is declared (its op's tasks.py imported)
TYPES: dict[int, type[Task]] = {}
FIELDS = 3  # a row's arguments after its type (runtime/device.py `task_row` reads them with the runtime's words)
# ids declared once and retired since: never given again
RETIRED = {25: "moe sum"}


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of a table. A task type is a subclass declared with its id and name, its fields (ints, at most
    `FIELDS`) the row's arguments in order; it is a frozen dataclass, registered in `TYPES` as it is declared:

        class SelectPass(Task, id=35, name="index select pass"):
            r: int  # the row
            ...
    """

    ID: ClassVar[int]  # the type's id in the one id space
    NAME: ClassVar[str]  # its name in traces and faults
    N_FIELDS: ClassVar[int]  # how many fields it declares (`fields` unpacks as many)

    def __init_subclass__(cls, id: int | None = None, name: str | None = None, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if id is None:  # an intermediate base: no type of its own
            return
        assert id not in RETIRED, f"task id {id} was {RETIRED[id]!r}: ids are never reused"
        other = TYPES.get(id)
        assert other is None or other.__qualname__ == cls.__qualname__, f"task id {id}: {other} and {cls}"
        cls.ID, cls.NAME = id, name
        dataclasses.dataclass(frozen=True)(cls)
        cls.N_FIELDS = len(dataclasses.fields(cls))
        TYPES[id] = cls

    def row(self) -> tuple[int, ...]:
        """Its table row's first words: the type's id, then the fields in order, zero-padded to `FIELDS`."""
        values = tuple(int(getattr(self, f.name)) for f in dataclasses.fields(self))
        assert len(values) <= FIELDS, f"{type(self).__name__} has {len(values)} fields, a row holds {FIELDS}"
        return (self.ID, *values, *(0,) * (FIELDS - len(values)))

    @classmethod
    def constexpr(cls) -> tl.constexpr:
        """The id as the device code compares it (`ttype == SEL_PASS`)."""
        return tl.constexpr(cls.ID)


def name_of(type_id: int) -> str:
    return TYPES[type_id].NAME


def types_mask(ids) -> int:
    """The task types `ids` as one int, a bit a type id: what a launch built for those types alone carries
    (`Schedule.ONLY`, knob stage_code=own). 0 stands for every type."""
    return sum(1 << int(getattr(i, "value", i)) for i in set(ids))


@triton.constexpr_function
def may_run(only, *ids) -> bool:
    """Whether a launch built for the task types `only` (`types_mask`; 0: every type) may run a task of one of
    `ids` (ints, or tuples of them). Every dispatch branch of a layer kernel tests it first, at compile time: in
    `may_run(ONLY, OPROJ) and ttype == OPROJ` a true first operand leaves the code as it was, a false one drops
    the branch, so a stage's own kernel holds its own tasks' code alone (fewer registers and less shared memory:
    more programs resident)."""
    flat = [j for i in ids for j in (i if isinstance(i, tuple) else (i,))]
    return only == 0 or any(only >> int(j) & 1 for j in flat)


@triton.constexpr_function
def field_count(type_id, types=TYPES) -> int:
    """How many fields task type `type_id` declares (its record's). `types` is bound once, as a default: Triton
    hashes what a device function reads of its module, and the registry grows as ops are imported."""
    return types[int(getattr(type_id, "value", type_id))].N_FIELDS


@triton.jit
def fields(row, TYPE: tl.constexpr):
    """A task's fields from its table row, in its type's order (`Task.row`): one value, or a tuple of two or
    three. TYPE is the type's id (a constexpr, `GU`), or that of a type with the same fields."""
    N: tl.constexpr = field_count(TYPE)
    if N == 1:
        out = row[1]
    elif N == 2:
        out = row[1], row[2]
    else:
        out = row[1], row[2], row[3]
    return out


def next_id() -> int:
    """The id a new task type takes: one past every id given (the retired ones included)."""
    return max([*TYPES, *RETIRED]) + 1


class Hop(Task, id=2, name="hop"):
    """The runtime's own no-op hand-off (runtime/chain.py): it waits, publishes and does nothing else."""


HOP = Hop.constexpr()
