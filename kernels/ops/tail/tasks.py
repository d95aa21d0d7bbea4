"""The task types of the tail (kernels/kinds/tail/). Each is a typed record (kernels/runtime/tasks.py `Task`): its
id, its name and its fields, which the device code reads by name (`fields(row, TYPE)`, kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class TailNorm(Task, id=3, name="final norm"):
    """Row r's mean of the streams, its final norm (ĥ) and 1/RMS."""

    r: int  # the row


TAIL_NORM = TailNorm.constexpr()


class TailLmHead(Task, id=4, name="lm_head"):
    """A tile of this rank's lm_head logits, every row."""

    n0: int  # the first logit column of the tile
    n: int  # its columns (at most the tile's)


TAIL_LM_HEAD = TailLmHead.constexpr()


class TailGather(Task, id=5, name="logits gather"):
    """A peer's logits columns into their place in the full rows."""

    peer: int  # the peer, 1-based in rank order without this rank
    c0: int  # the first column of the chunk


TAIL_GATHER = TailGather.constexpr()
