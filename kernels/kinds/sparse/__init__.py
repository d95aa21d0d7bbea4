"""The `sparse` kind: one DSA layer with the MoE (layers 3, 7, ..., 43 of glm53_flash) as one persistent launch.
Its facts.

The launch is the layer kernel (kernels/kinds/layer/) with MLA as its attention half (ops/dsa/layer.py, the bodies of
kernels/ops/dsa; the table's `_add_mla`) and the MoE as its FFN half (`kda`'s). This folder holds its facts, its
harness (the caches and positions a key takes) and its stock-PyTorch baseline.

Knobs: `kda`'s (those only the KDA attention reads give the same launch here, so `tune` times them once),
`token_block`, the tokens per attention task, and `select_passes`, the top-k's radix passes that are tasks.
"""

from glm53ctl.kernels.kinds.base import Knob
from glm53ctl.kernels.kinds.dense import LAYER_DIMS
from glm53ctl.kernels.kinds.dims import (
    Dim,
    multiple_of,
    o_proj_width,
    power_of_two,
    power_of_two_below,
    power_of_two_or_multiple,
)
from glm53ctl.kernels.kinds.kda import BOUNDS as KDA_BOUNDS
from glm53ctl.kernels.kinds.kda import KNOBS as KDA_KNOBS
from glm53ctl.kernels.kinds.kda import MOE_DIMS, RUNTIME, RUNTIME_DEFAULTS

__all__ = ["BOUNDS", "KNOBS", "RUNTIME", "RUNTIME_DEFAULTS"]

LAYER = ("dsa", "moe")  # the layer it runs: (attention, FFN) (kernels/spec.py)
KNOBS = KDA_KNOBS + (
    Knob(
        "token_block",
        (32, 64, 128),
        64,
        "numeric",
        "selected tokens per attention task (its log-sum-exp partial; the combine adds the blocks in order)",
    ),
    Knob(
        "select_passes",
        (4, 3, 2, 1, 0),
        4,
        "schedule",
        "radix passes of the indexer's top-k as tasks over parts of a row's pools, each a hand-off; with fewer "
        "(where the caches hold at most 4,096 pools), each part's take finds the threshold's other digits itself, "
        "a 256-bin histogram over every pool's key each, instead of waiting for a pass",
    ),
)

# the attention half's outputs carry MLA's bf16 hand-offs (q, q_lat, o_lat, o); the cache writes one bf16 rounding
# of fp32 norms; the selection itself is exact (check's invariants)
BOUNDS = {n: b for n, b in KDA_BOUNDS.items() if not n.startswith("kda.")} | {
    "dsa.latent": 1e-2,
    "dsa.index_key": 1e-2,
    "dsa.index_gate": 1e-2,
    "dsa.pooled_key": 1e-2,
}

DIMS = (
    LAYER_DIMS
    + MOE_DIMS
    + (
        Dim("mla.kv_lora_rank", power_of_two(16), "the latent's tl.arange and the scores' tl.dot K"),
        Dim("mla.qk_nope_head_dim", power_of_two_or_multiple(16, 128), "the absorb's K tiles within a head"),
        Dim("mla.v_head_dim", power_of_two_below(64), "W_UV's output tile"),
        o_proj_width("mla.heads", "mla.v_head_dim"),
        Dim("mla.q_lora_rank", multiple_of(16), "q_b's tl.dot K tile"),
        Dim("indexer.head_dim", power_of_two(16), "the indexer's tl.arange and its scores' tl.dot K"),
        Dim("indexer.heads", power_of_two(), "the indexer's tl.arange over its heads"),
        Dim("indexer.kpool", power_of_two(), "the pooling's tl.arange over a pool"),
    )
)
