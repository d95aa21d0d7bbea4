"""The task types of the tail (kernels/kinds/tail/). Each is a typed record (kernels/runtime/tasks.py `Task`): its
id, its name and its fields, which the device code reads by name through the one unpacking function beside it
(`<type>_fields(row)`)."""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


class TailNorm(Task, id=3, name="final norm"):
    """Row r's mean of the streams, its final norm (ĥ) and 1/RMS."""

    r: int  # the row


TAIL_NORM = TailNorm.constexpr()


@triton.jit
def tail_norm_fields(row):
    """TailNorm's fields from its table row: r."""
    return row[1]


class TailLmHead(Task, id=4, name="lm_head"):
    """A tile of this rank's lm_head logits, every row."""

    n0: int  # the first logit column of the tile
    n: int  # its columns (at most the tile's)


TAIL_LM_HEAD = TailLmHead.constexpr()


@triton.jit
def tail_lm_head_fields(row):
    """TailLmHead's fields from its table row: n0, n."""
    return row[1], row[2]


class TailGather(Task, id=5, name="logits gather"):
    """A peer's logits columns into their place in the full rows."""

    peer: int  # the peer, 1-based in rank order without this rank
    c0: int  # the first column of the chunk


TAIL_GATHER = TailGather.constexpr()


@triton.jit
def tail_gather_fields(row):
    """TailGather's fields from its table row: peer, c0."""
    return row[1], row[2]
