"""The `tail` kind: mean of the streams, final norm, vocab-parallel lm_head, logits gathered. Its facts.

Files: `table.py`, `kernel.py`, `launch.py`, `harness.py`, as every kind. Knob defaults: the best of the H200
sweeps in docs/perf/tail.md (TP4/TP8, rows 1/8).
"""

from glm53ctl.kernels.kinds.base import LAUNCH, Knob
from glm53ctl.kernels.kinds.dims import Dim, exactly, power_of_two

KNOBS = (
    LAUNCH,
    Knob("block_n", (16, 32, 64, 128), 64, "schedule", "GEMV output rows per task"),
    Knob("block_k", (64, 128, 256, 512), 128, "numeric", "GEMV K tile: it sets the fp32 reduction order"),
    Knob(
        "gathers",
        ("first", "last"),
        "last",
        "schedule",
        "the peers' logits copies: before the GEMV tasks (overlap the norm) or after them in the table (with "
        "split even: beside the stream, on the programs kept out of the deal)",
    ),
    Knob(
        "split",
        ("tiles", "even"),
        "even",
        "schedule",
        "lm_head rows per GEMV task: block_n, or dealt evenly over the grid's programs (up to block_n; "
        "with gathers last, a program in 16 kept for the gathers)",
    ),
    Knob(
        "norm",
        ("task", "fold", "auto"),
        "fold",
        "numeric",
        "lm_head waits for the normalized rows (task), or streams H's stream rows against its weights with the "
        "norm weight folded in and waits for the rows' 1/RMS only at its end (fold); auto: fold where the "
        "stream rows fit a 16-row tile (rows <= 4), else task",
    ),
)
RUNTIME = ("grid", "warps", "handoff", "poll", "stages")
RUNTIME_DEFAULTS = {"stages": 3}
# a GEMV over bf16 inputs with fp32 accumulation: a few bf16 roundings (about 2^-9 each)
BOUNDS = {"h_hat": 1e-2, "logits": 1e-2}
DIMS = (
    # the final norm's tl.arange over the row; a PDL-chained step's prefetch of D * 2 // 128 lines
    Dim("model.hidden_size", power_of_two(64), "the final norm's tl.arange over the hidden size"),
    Dim("mhc.streams", exactly(4), "lm_head with the norm folded in sums four streams a row"),
)
