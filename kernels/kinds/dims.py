"""What a kind's kernels need of a model's dimensions (issue 45): each kind's folder declares its rules (`DIMS` in
its __init__.py, read by the registry), each a model field, per rank or whole, and what its value must be. A
model file the kernels cannot run is refused by every command before it launches (exit 2: the dimension, the
rule, the nearest valid value), and `configs validate` says which kinds and TP widths a model file can run.

The rules are the kernels' at their default knobs (a tuned knob can only narrow them, and its key's tables
assert the rest when they are built): a `tl.arange` over the dimension needs a power of two; a GEMV's K slices
must be whole K tiles (`layer/table.py` `Dims`: block_k 128, ksplit 2); `tl.dot` needs K of 16 or more; the
norm folded into a GEMV sums exactly four streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """What a value must be: `holds(v)`, and `says`, in words."""

    holds: Callable[[int], bool]
    says: str


def is_power_of_two(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def power_of_two(least: int = 1) -> Rule:
    return Rule(lambda v: is_power_of_two(v) and v >= least, "a power of two" + (f" ≥ {least}" if least > 1 else ""))


def power_of_two_or_multiple(least: int, multiple: int) -> Rule:
    """Whole K tiles: a power of two from `least` (one tile of itself), or whole tiles of `multiple`."""
    return Rule(
        lambda v: (is_power_of_two(v) and v >= least) or (v > 0 and v % multiple == 0),
        f"a power of two ≥ {least} or a multiple of {multiple}",
    )


def power_of_two_below(bound: int) -> Rule:
    """A tile of min(bound, v): a power of two below `bound`, anything from it up (masked)."""
    return Rule(lambda v: v >= bound or is_power_of_two(v), f"a power of two, or {bound} or more")


def multiple_of(n: int) -> Rule:
    return Rule(lambda v: v > 0 and v % n == 0, f"a multiple of {n}")


def exactly(n: int) -> Rule:
    return Rule(lambda v: v == n, f"{n}")


@dataclass(frozen=True)
class Dim:
    """One rule of a kind's kernels on a model dimension. `field`: the model file's key that sets it
    (`moe.intermediate_size`); `per_rank`: the rule is on the field divided by the TP width; `times`: a second
    field the value is multiplied by (a projection's K width: heads x head_dim); `of`: the value derived from the
    whole model instead (its layers' shapes); `why`: where the kernels need it."""

    field: str
    rule: Rule
    why: str
    per_rank: bool = False
    times: str | None = None
    of: Callable | None = None
    named: str | None = None  # what `of` counts, in words

    def value(self, spec, tp: int) -> int:
        if self.of is not None:
            return self.of(spec)
        v = field_value(spec, self.field) * (field_value(spec, self.times) if self.times else 1)
        return v // tp if self.per_rank else v

    def name(self) -> str:
        if self.named:
            return self.named
        whole = self.field + (f" × {self.times}" if self.times else "")
        return f"{whole} / TP" if self.per_rank else whole

    def nearest(self, spec, tp: int) -> int | None:
        """The nearest value of `field` (the others as they are) that holds at this width, None past twice it."""
        v = field_value(spec, self.field)
        for d in range(0, 2 * v + 1):
            for w in dict.fromkeys((v - d, v + d)):
                if w < 0 or (self.per_rank and w % tp):
                    continue
                if self.rule.holds(self.value(_with(spec, self.field, w), tp)):
                    return w
        return None


def o_proj_width(heads: str, head_dim: str) -> Dim:
    """o_proj's K, a rank's heads x head_dim: two K slices (ksplit 2) of whole block_k tiles."""
    why = "o_proj's K slices of whole tiles"
    return Dim(heads, power_of_two_or_multiple(16, 256), why, per_rank=True, times=head_dim)


def _with(spec, field: str, value: int):
    """`spec` with one field changed (not validated: only its dimensions are read)."""
    group, name = field.split(".")
    return spec.model_copy(update={group: getattr(spec, group).model_copy(update={name: value})})


def field_value(spec, field: str) -> int:
    group, name = field.split(".")
    return getattr(getattr(spec, group), name)


@dataclass(frozen=True)
class Broken:
    """A rule a model breaks at a TP width, in words: `model.hidden_size = 100: tail needs a power of two ≥ 64
    (...); nearest 128`."""

    kind: str
    tp: int
    dim: Dim
    value: int  # what the rule judged (per rank, or the product)
    whole: int  # the field's value in the model file
    nearest: int | None

    def __str__(self) -> str:
        d = self.dim
        said = f"{d.field} = {self.whole}"
        if d.per_rank or d.times or d.of:
            said = f"{d.name()} = {self.value}" + (f" at TP {self.tp}" if d.per_rank else "") + f" ({said})"
        near = f"; nearest {d.field} = {self.nearest}" if self.nearest is not None else ""
        return f"{said}: {self.kind} needs {d.rule.says} ({d.why}){near}"
