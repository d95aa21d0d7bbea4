"""The `tail` kind's tasks: NORM (one per row: ĥ[r] and its 1/RMS), LM_HEAD (a slice of this rank's lm_head
rows; waits on every NORM, by flags or by box lines), GATHER (a slice of a peer's logits; waits on that peer).

Knobs (defaults measured on the H200, docs/perf/tail.md):
- `norm` "fold": the final norm's weight is folded into lm_head once on the host (w' = w ⊙ norm_w), so a
  GEMV task streams H's stream rows against w' at once and waits for the NORM tasks' 1/RMS only at its end,
  to scale its sums: the hand-off leaves the critical path (different bits: a `numeric` knob). "task": a
  GEMV task waits for ĥ before its weights stream. "auto": fold at rows <= 4.
- `split` "even": the lm_head rows dealt evenly, one task per program; "tiles": block_n rows a task.
- `gathers` "last": GATHER tasks after the GEMV tasks, run beside the stream by the programs kept out of the
  deal; "first": before them.
"""

from __future__ import annotations

import triton

from glm53ctl.kernels.ops.tail.tasks import TailGather, TailLmHead, TailNorm
from glm53ctl.kernels.runtime.table import TaskTable

GATHER_N = 1024  # logits columns a GATHER task copies
SPARE_EVERY = 16  # split "even" with gathers "last": one program in SPARE_EVERY is kept out of the GEMV deal


def add_tail(
    t: TaskTable,
    rows: int,
    v_local: int,
    tp: int,
    block_n: int,
    handoff: str,
    gathers: str = "first",
    split: str = "tiles",
    grid: int = 1,
    fold: bool = False,
    after: list[int] = (),
) -> list[int]:
    """Append the tail's tasks to `t`; the tasks that read H wait on `after` (the tasks that produce H, when the
    tail is part of a larger table). Returns the tasks that write logits.

    fold (knob `norm`, `gemv.folds`): an LM_HEAD task streams H's stream rows before its NORM sites, which are
    late (waited after the stream); it waits on `after` early, before the stream.

    gathers "first": programs copy the peers' logits while the rows are normalized; "last": the copies
    fill the programs that run out of GEMV tasks at the end.

    split "tiles": GEMV tasks of block_n rows. "even": the rows dealt evenly over the programs left after the
    NORM tasks, the same number of tasks for each (up to block_n rows a task): no program streams a tile
    more than the others at the end of the launch (303 tiles of 64 rows over 396 programs at TP8 leave
    some SMs three and others one). With gathers "last", one program in 16 is also left out of the deal:
    those programs (and the NORM tasks' programs once done) copy the peers' logits while the others
    stream, instead of after them."""
    step = block_n
    if split == "even":
        spare = min(grid // SPARE_EVERY, (tp - 1) * triton.cdiv(v_local, GATHER_N)) if gathers == "last" else 0
        free = max(grid - rows - spare, 1)
        step = triton.cdiv(v_local, triton.cdiv(triton.cdiv(v_local, block_n), free) * free)
    out = []

    def add_gathers() -> None:
        for peer in range(1, tp):
            for c0 in range(0, v_local, GATHER_N):
                g = t.add(TailGather(peer, c0))
                t.wait_peer(g, peer)
                out.append(g)

    norms = []
    for r in range(rows):
        norms.append(t.add(TailNorm(r)))
        if after:
            t.wait(norms[-1], list(after), handoff)
    if gathers == "first":
        add_gathers()
    for n0 in range(0, v_local, step):
        g = t.add(TailLmHead(n0, min(step, v_local - n0)))
        if fold and after:
            t.wait(g, list(after), handoff)
        t.wait(g, norms, handoff, late=fold)  # for ĥ before the stream, or (folded) for 1/RMS after it
        out.append(g)
    if gathers == "last":
        add_gathers()
    return out


def build_table(rows: int, v_local: int, tp: int, *layout, **named) -> TaskTable:
    """The tail's own table: `add_tail`'s tasks (its arguments after the table's) alone."""
    t = TaskTable("tail", peers=tp - 1)
    add_tail(t, rows, v_local, tp, *layout, **named)
    return t
