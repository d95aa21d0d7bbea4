"""The `sparse` kind: one DSA layer with the MoE (layers 3, 7, ..., 43 of glm53_flash) as one persistent launch.
Its facts.

The launch is the layer kernel (kernels/kinds/layer/) with MLA as its attention half (layer/mla.py, the bodies of
kernels/ops/dsa; the table's `_add_mla`) and the MoE as its FFN half (`kda`'s). This folder holds its facts, its
harness (the caches and positions a key takes) and its stock-PyTorch baseline.

Knobs: `kda`'s (those only the KDA attention reads give the same launch here, so `tune` times them once), and
`token_block`, the tokens per attention task.
"""

from glm53ctl.kernels.kinds.base import Knob
from glm53ctl.kernels.kinds.kda import BOUNDS as KDA_BOUNDS
from glm53ctl.kernels.kinds.kda import KNOBS as KDA_KNOBS
from glm53ctl.kernels.kinds.kda import RUNTIME, RUNTIME_DEFAULTS

__all__ = ["BOUNDS", "KNOBS", "RUNTIME", "RUNTIME_DEFAULTS"]

KNOBS = KDA_KNOBS + (
    Knob(
        "token_block",
        (32, 64, 128),
        64,
        "numeric",
        "selected tokens per attention task (its log-sum-exp partial; the combine adds the blocks in order)",
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
