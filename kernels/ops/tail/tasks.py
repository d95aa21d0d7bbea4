"""The task types of the tail (kernels/kinds/tail/). Each is a typed record (kernels/runtime/tasks.py `Task`): its
id, its name and its fields, which the device code reads by name through the one unpacking function beside it
(`<type>_fields(row)`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


@dataclass(frozen=True)
class TailNorm(Task):
    """Row r's mean of the streams, its final norm (ĥ) and 1/RMS."""

    ID: ClassVar[int] = 3
    NAME: ClassVar[str] = "final norm"
    r: int  # the row


TAIL_NORM = TailNorm.constexpr()


@triton.jit
def tail_norm_fields(row):
    """TailNorm's fields from its table row: r."""
    return row[1]


@dataclass(frozen=True)
class TailLmHead(Task):
    """A tile of this rank's lm_head logits, every row."""

    ID: ClassVar[int] = 4
    NAME: ClassVar[str] = "lm_head"
    n0: int  # the first logit column of the tile
    n: int  # its columns (at most the tile's)


TAIL_LM_HEAD = TailLmHead.constexpr()


@triton.jit
def tail_lm_head_fields(row):
    """TailLmHead's fields from its table row: n0, n."""
    return row[1], row[2]


@dataclass(frozen=True)
class TailGather(Task):
    """A peer's logits columns into their place in the full rows."""

    ID: ClassVar[int] = 5
    NAME: ClassVar[str] = "logits gather"
    peer: int  # the peer, 1-based in rank order without this rank
    c0: int  # the first column of the chunk


TAIL_GATHER = TailGather.constexpr()


@triton.jit
def tail_gather_fields(row):
    """TailGather's fields from its table row: peer, c0."""
    return row[1], row[2]
