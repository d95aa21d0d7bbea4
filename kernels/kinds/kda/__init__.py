"""The `kda` kind: one KDA layer with the MoE (31 of glm53_flash's 45 layers) as one persistent launch. Its facts.

The attention half is `dense`'s: the same tasks, the same knobs. The FFN half is the MoE (docs/model.md §6.2):
router tiles and the routing decided in the launch, then per slot (the shared expert's, and one per expert the
rows chose, in ascending order) its gate/up and down tiles, and per row and column chunk the sum in expert order
(kernels/ops/ffn/moe.py). The table, kernel and launch are `dense`'s with `ffn="moe"` (kinds/dense/table.py
`_add_moe`); this folder holds what differs: its facts and its harness. Knobs that only the dense MLP reads
(`ksplit_gu`, `ffn_mix`'s gate/up) give the same launch here, so `tune` never times them twice.
"""

from glm53ctl.kernels.kinds.dense import BOUNDS as DENSE_BOUNDS
from glm53ctl.kernels.kinds.dense import KNOBS, RUNTIME, RUNTIME_DEFAULTS

__all__ = ["BOUNDS", "KNOBS", "RUNTIME", "RUNTIME_DEFAULTS"]

# the routing weights follow x̂ through the router (the launch's x̂ is the launch's, as ffn.x_hat's bound says;
# tiny measured 5e-4 to 1e-3); the routed ids are checked exactly (check's routing invariants)
BOUNDS = DENSE_BOUNDS | {"moe.weights": 1e-2}
