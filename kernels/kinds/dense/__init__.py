"""The `dense` kind: one KDA layer with the dense MLP (layers 0-2) as one persistent launch. Its facts.

The launch is the layer kernel (kernels/kinds/layer/) with KDA as its attention half and the dense MLP as its
FFN half; this folder holds its facts and `harness.py` (one key with its peers).
Knob defaults: the best of the H200 sweeps and traces in docs/perf/dense.md.
"""

from glm53ctl.kernels.kinds.base import LAUNCH, STAGE_CODE, Knob
from glm53ctl.kernels.kinds.dims import Dim, exactly, o_proj_width, power_of_two, power_of_two_or_multiple

LAYER = ("kda", "dense")  # the layer it runs: (attention, FFN) (kernels/spec.py)
KNOBS = (
    LAUNCH,
    STAGE_CODE,
    # a tile per stage, so each stage has enough tasks
    Knob("block_n_in", (16, 32, 64), 32, "schedule", "in-projection rows per task"),
    Knob(
        "block_n_gu",
        (16, 32, 64),
        32,
        "schedule",
        "gate/up rows per task (each task runs both GEMVs and the SwiGLU over them)",
    ),
    Knob(
        "block_n_out",
        (16, 32, 64, 128),
        32,
        "schedule",
        "GEMV output rows per task of the narrow stages that end in a reduce (o_proj, down_proj)",
    ),
    Knob(
        "box_words",
        (8, 16, 32),
        32,
        "schedule",
        "producers per 128-byte box line a consumer polls (fewer: more lines, less contention per line)",
    ),
    Knob(
        "oproj_first",
        (0, 1),
        0,
        "schedule",
        "a KDA task publishes z, its program runs the next task (o_proj), then writes the states back",
    ),
    Knob(
        "kda_split",
        (0, 1, 2, 4),
        0,
        "schedule",
        "programs per KDA head, each on its share of the state's value columns (the last to arrive makes z); "
        "0: the most of 4, 2, 1 whose parts the grid's programs cover",
    ),
    Knob(
        "chunk_cols",
        (64, 128, 256),
        128,
        "numeric",
        "columns per mix / reduce task (more, smaller tasks on the chain's latency-bound steps)",
    ),
    Knob(
        "ksplit",
        (1, 2, 4),
        2,
        "numeric",
        "K slices of o_proj and down_proj (more tasks on narrow stages); fewer where K is narrow",
    ),
    Knob(
        "ksplit_gu",
        (1, 2, 4),
        2,
        "numeric",
        "K slices of gate/up (shorter loops: a program's stream is latency-bound); slice 0 adds them in order",
    ),
    Knob(
        "ksplit_in",
        (1, 2, 4),
        1,
        "numeric",
        "K slices of the in-projection (shorter loops: a program's stream is latency-bound); slice 0 adds them",
    ),
    Knob("block_k", (64, 128, 256, 512), 128, "numeric", "GEMV K tile: it sets the fp32 reduction order"),
    Knob(
        "maxnreg",
        (0, 168, 128),
        0,
        "schedule",
        "registers a thread may hold (0: the compiler's choice, 240-255 for dense: 2 programs of 4 warps per SM; "
        "168: 3, 128: 4), so that more of the grid's programs are resident at once",
    ),
    # on the H200 once no KDA part waits for another: 3 faster at 5 of 6 keys traced (TP8 rows 8 by 11%),
    # within 0.3% at the sixth
    Knob(
        "prefetch",
        (0, 3),
        3,
        "schedule",
        "before its wait, a task asks L2 for what no producer writes: 3 the KDA heads' weights and state and the "
        "attention reduces' FFN mix rows (1, every GEMV tile too, and 2, o_proj's, gate/up's and down's: slower at "
        "every key measured, removed)",
    ),
    Knob(
        "weights_first",
        (0, 1),
        0,
        "schedule",
        "the in-projection, o_proj, down_proj and (dense) gate/up tasks load their first K tile of weights (all "
        "of it where block_k covers the task's K slice) before they wait for their input, so their weights "
        "stream while they wait; the same sums (launch=stages: always)",
    ),
    Knob(
        "ffn_mix",
        ("reduce", "task", "auto"),
        "auto",
        "schedule",
        "the FFN gate's mix logits of a column chunk: made by the attention reduce of the chunk, or by a task of "
        "their own after it (a folded gate/up waits only for the reduces' H1, so starts sooner); auto: task "
        "where gate/up folds the norm (knob norm)",
    ),
    Knob(
        "norm",
        ("task", "fold", "auto"),
        "auto",
        "numeric",
        "the in-projection and gate/up wait for the normalized rows (task), or stream H's stream rows against "
        "their weights with the norm weight folded in and wait for the rows' scale (1/RMS and the gate's pre) "
        "only at their end (fold); auto: fold where the stream rows fit a 16-row tile (rows <= 4), else task",
    ),
)
RUNTIME = ("grid", "warps", "handoff", "poll", "stages")
# poll 0 on the H200, once a wait read its clock and abort word every 8th round only: faster at all 5 keys
# traced, 1-3%
RUNTIME_DEFAULTS = {"poll": 0}
# relative RMS bounds per output: the attention gate reads the inputs and is fp32 math (1e-5); everything after
# the in-projection carries its bf16 GEMVs' rounding (measured 1e-3 to 5e-3 on tiny; bounds with margin)
BOUNDS = {
    "attn.x_hat": 1e-2,
    "attn.post": 1e-5,
    "attn.comb": 1e-5,
    "attn.out": 2e-2,
    "attn.H": 1e-2,
    "ffn.x_hat": 1e-2,
    "ffn.post": 5e-3,
    "ffn.comb": 5e-3,
    "ffn.out": 2e-2,
    "H": 1e-2,
    "kda.conv": 1e-2,
    "kda.recurrent": 1e-2,
}

# what the layer kernel needs of every layer's dimensions (layer/table.py `Dims` asserts the K tiles; block_k 128
# and ksplit 2, the defaults, set the multiples; a folded norm sums four streams)
LAYER_DIMS = (
    # the column chunks (chunk_cols) and the router's four K slices of whole block_k tiles
    Dim("model.hidden_size", power_of_two_or_multiple(128, 512), "the column chunks and the router's K slices"),
    Dim("mhc.streams", exactly(4), "a GEMV with the norm folded in sums four streams a row"),
    Dim("kda.gate_rank", power_of_two_or_multiple(16, 128), "the gates' GEMV K tiles"),
)
KDA_DIMS = (
    Dim("kda.head_dim", power_of_two(4), "the KDA recurrence's tl.arange over a head"),
    o_proj_width("kda.heads", "kda.head_dim"),
)
# down_proj's K: two K slices (ksplit 2) of whole block_k tiles
DOWN = Dim("moe.dense_intermediate_size", power_of_two_or_multiple(16, 256), "down_proj's K tiles", per_rank=True)
DIMS = LAYER_DIMS + KDA_DIMS + (DOWN,)
