"""The `embed` kind's tasks: per D-chunk a GATHER (this rank's rows for the tokens it owns, an fp32 partial)
and a REDUCE (waits on its GATHER and on every peer's partial; sums in rank order; writes every stream).
`partial_only` lays out the GATHER tasks alone: how the harness computes a peer rank's partial."""

from __future__ import annotations

from glm53ctl.kernels.ops.embed.tasks import EmbedGather, EmbedReduce
from glm53ctl.kernels.runtime.table import TaskTable


def add_embed(
    t: TaskTable, D: int, chunk: int, tp: int, handoff: str, partial_only: bool, gathers_first: bool = False
) -> list[int]:
    """Append embed's tasks to `t` (nothing to wait for: its input is the token ids); the tasks that produce H
    (or, partial_only, the partial), one per chunk. `gathers_first` (real ranks): every GATHER before the first
    REDUCE, since a rank's tag says its whole partial is pushed (a reduce waiting in table order before its
    rank's last gather would wait on peers that wait on it)."""
    chunks = range(0, D, chunk)
    if gathers_first:
        gathers = [t.add(EmbedGather(d0)) for d0 in chunks]
    out = []
    for c, d0 in enumerate(chunks):
        g = gathers[c] if gathers_first else t.add(EmbedGather(d0))
        if partial_only:
            out.append(g)
            continue
        r = t.add(EmbedReduce(d0))
        t.wait(r, [g], handoff)
        if tp > 1:
            t.wait_peers(r)
        out.append(r)
    return out


def build_table(
    D: int, chunk: int, tp: int, handoff: str, partial_only: bool, peer_ranks: list[int] | None = None
) -> TaskTable:
    """`peer_ranks` (real ranks): this rank's peers in rank order."""
    t = TaskTable("embed", peers=0 if partial_only else tp - 1, peer_ranks=peer_ranks)
    add_embed(t, D, chunk, tp, handoff, partial_only, gathers_first=peer_ranks is not None)
    return t
