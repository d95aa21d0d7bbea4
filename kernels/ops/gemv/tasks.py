"""The task types of the GEMVs every layer has (kernels/kinds/layer/shared.py). Each is a typed record
(kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by name
(`fields(row, TYPE)`, kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class OProj(Task, id=11, name="o_proj"):
    """A tile of o_proj over a K slice: this rank's partial."""

    n0: int  # the tile's first output column
    ks: int  # the K slice


OPROJ = OProj.constexpr()
