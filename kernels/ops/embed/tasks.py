"""The task types of the embedding (kernels/kinds/embed/). Each is a typed record (kernels/runtime/tasks.py `Task`):
its id, its name and its fields, which the device code reads by name through the one unpacking function beside it
(`<type>_fields(row)`)."""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


class EmbedGather(Task, id=0, name="embed gather"):
    """A column chunk of every row's embedding, gathered from this rank's vocabulary slice."""

    d0: int  # the first column of the chunk gathered from this rank's vocabulary slice


EMBED_GATHER = EmbedGather.constexpr()


class EmbedReduce(Task, id=1, name="embed reduce"):
    """A column chunk of H: the ranks' gathers summed."""

    d0: int  # the chunk's first column


EMBED_REDUCE = EmbedReduce.constexpr()


@triton.jit
def embed_fields(row):
    """EmbedGather's and EmbedReduce's one field from their table row: d0."""
    return row[1]
