"""The task types of the KDA attention half (their dispatch and bodies in the layer kernel: layer.py). Each is a
typed record (kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by name
(`fields(row, TYPE)`, kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class InProj(Task, id=9, name="in_proj"):
    """A tile of the fused in-projection over a K slice."""

    n0: int  # the tile's first row of the fused in-projection
    ks: int  # its K slice (slice 0 adds the others' sums)


INPROJ = InProj.constexpr()


class KdaHead(Task, id=10, name="kda head"):
    """One head of one row: the gates, the conv, the delta rule on a part of its value columns."""

    h: int  # the head
    r: int  # the row
    part: int  # the part of the head's value columns


KDA_HEAD = KdaHead.constexpr()
