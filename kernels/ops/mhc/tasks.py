"""The task types of the mHC gates, mixes and all-reduces every layer has (kernels/kinds/layer/shared.py). Each is a
typed record (kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by
name through the one unpacking function beside it (`<type>_fields(row)`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


@dataclass(frozen=True)
class MixA(Task):
    """A column chunk of one row's attention-gate mix logits, sum of squares and Gram matrix."""

    ID: ClassVar[int] = 6
    NAME: ClassVar[str] = "attn mix"
    c: int  # the column chunk
    r: int  # the row


MIX_A = MixA.constexpr()


@dataclass(frozen=True)
class GateA(Task):
    """Row r's attention gate (hc_pre without the comb) and chunk c of x̂; chunk 0 also post, pre and 1/RMS."""

    ID: ClassVar[int] = 7
    NAME: ClassVar[str] = "attn gate"
    r: int  # the row
    c: int  # the column chunk


GATE_A = GateA.constexpr()


@dataclass(frozen=True)
class CombA(Task):
    """Row r's Sinkhorn comb (for hc_post)."""

    ID: ClassVar[int] = 8
    NAME: ClassVar[str] = "attn comb"
    r: int  # the row


COMB_A = CombA.constexpr()


@dataclass(frozen=True)
class ReduceA(Task):
    """A column chunk of one row: the attention partials summed in rank order, hc_post (H1)."""

    ID: ClassVar[int] = 12
    NAME: ClassVar[str] = "attn reduce"
    c: int  # the column chunk
    r: int  # the row


RED_A = ReduceA.constexpr()


@dataclass(frozen=True)
class OwnA(Task):
    """A column chunk of this rank's attention partial, for its peers."""

    ID: ClassVar[int] = 13
    NAME: ClassVar[str] = "attn partial"
    c: int  # the column chunk
    r: int  # the row


OWN_A = OwnA.constexpr()


@dataclass(frozen=True)
class MixF(Task):
    """A column chunk of one row's FFN-gate mix logits, as a task of its own."""

    ID: ClassVar[int] = 14
    NAME: ClassVar[str] = "ffn mix"
    c: int  # the column chunk
    r: int  # the row


MIX_F = MixF.constexpr()


@dataclass(frozen=True)
class GateF(Task):
    """Row r's FFN gate on H1 and chunk c of x̂."""

    ID: ClassVar[int] = 15
    NAME: ClassVar[str] = "ffn gate"
    r: int  # the row
    c: int  # the column chunk


GATE_F = GateF.constexpr()


@dataclass(frozen=True)
class CombF(Task):
    """Row r's FFN comb."""

    ID: ClassVar[int] = 16
    NAME: ClassVar[str] = "ffn comb"
    r: int  # the row


COMB_F = CombF.constexpr()


@dataclass(frozen=True)
class ReduceF(Task):
    """A column chunk of one row: the FFN partials summed in rank order, hc_post (H)."""

    ID: ClassVar[int] = 19
    NAME: ClassVar[str] = "ffn reduce"
    c: int  # the column chunk
    r: int  # the row


RED_F = ReduceF.constexpr()


@dataclass(frozen=True)
class OwnF(Task):
    """A column chunk of this rank's FFN partial, for its peers."""

    ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "ffn partial"
    c: int  # the column chunk
    r: int  # the row


OWN_F = OwnF.constexpr()


@triton.jit
def gate_fields(row):
    """A gate's or comb's fields from its table row (GateA, GateF; CombA, CombF, whose c is 0): r, c."""
    return row[1], row[2]


@triton.jit
def chunk_fields(row):
    """A mix's, reduce's or partial's fields from its table row (MixA, MixF, ReduceA, ReduceF, OwnA, OwnF): c, r."""
    return row[1], row[2]
