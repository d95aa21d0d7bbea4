"""The task types of the embedding (kernels/kinds/embed/). Each is a typed record (kernels/runtime/tasks.py `Task`):
its id, its name and its fields, which the device code reads by name (`fields(row, TYPE)`,
kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class EmbedGather(Task, id=0, name="embed gather"):
    """A column chunk of every row's embedding, gathered from this rank's vocabulary slice."""

    d0: int  # the first column of the chunk gathered from this rank's vocabulary slice


EMBED_GATHER = EmbedGather.constexpr()


class EmbedReduce(Task, id=1, name="embed reduce"):
    """A column chunk of H: the ranks' gathers summed."""

    d0: int  # the chunk's first column


EMBED_REDUCE = EmbedReduce.constexpr()
