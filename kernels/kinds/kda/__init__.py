"""The `kda` kind: one KDA layer with the MoE (31 of glm53_flash's 45 layers) as one persistent launch. Its facts.

The attention half is `dense`'s: the same tasks, the same knobs. The FFN half is the MoE (docs/model.md §6.2):
router tiles over K slices and the routing decided in the launch (a task per row; the last to arrive makes the
slots), then per slot (the shared expert's, and one per expert the rows chose, in ascending order) its gate/up
tiles over K slices and its down tiles; the FFN reduce of each row and column chunk sums the slots in expert
order itself (kernels/ops/ffn/moe.py). The table, kernel and launch are the layer kernel's with `ffn="moe"`
(kinds/layer/: its table's `_add_moe`, moe.py); this folder holds its facts and its harness.

Knobs: `dense`'s, read the same way where the MoE has the same step (`block_n_gu`, `ksplit_gu`: the experts'
gate/up tiles and K slices), `block_n_down`, the experts' down tiles, and `route`, where the routed experts'
gate/up learn their expert (the routing's hand-off, or deciding it again from the router's logits), and
`down_stage`, where the stage schedule runs the experts' down projections (a launch of their own, or gate/up's).
`ffn_mix` and `norm` reach only the attention half and the FFN gate here (no expert folds the norm: each reads x̂
after the routing).
"""

from glm53ctl.kernels.kinds.base import Knob
from glm53ctl.kernels.kinds.dense import BOUNDS as DENSE_BOUNDS
from glm53ctl.kernels.kinds.dense import KDA_DIMS, LAYER_DIMS, RUNTIME, RUNTIME_DEFAULTS
from glm53ctl.kernels.kinds.dense import KNOBS as DENSE_KNOBS
from glm53ctl.kernels.kinds.dims import Dim, Rule, exactly, is_power_of_two

__all__ = ["BOUNDS", "KNOBS", "RUNTIME", "RUNTIME_DEFAULTS"]

LAYER = ("kda", "moe")  # the layer it runs: (attention, FFN) (kernels/spec.py)
KNOBS = DENSE_KNOBS + (
    Knob(
        "block_n_down",
        (0, 16, 32, 64, 128),
        0,
        "schedule",
        "output rows per expert down-projection task; 0: 64, or 64 KB of weights where that is more (128 at TP8)",
    ),
    Knob(
        "route",
        ("task", "each"),
        "task",
        "schedule",
        "task: a ROUTE task per row decides the routing and the routed experts' gate/up wait for it; each: every "
        "routed gate/up task decides its own slot's expert from the router's logits (the routing's hand-off and "
        "length off the path; each task repeats every row's top-k)",
    ),
    Knob(
        "down_stage",
        ("own", "gate_up"),
        "own",
        "schedule",
        "with launch=stages, the experts' down projections as a stage launch of their own after gate/up's (own), "
        "or in gate/up's launch (gate_up): each down program resident while gate/up drains, its wait a flag in "
        "the same launch instead of the launch boundary (its weights still read after the wait)",
    ),
)

# the routing weights follow x̂ through the router (the launch's x̂ is the launch's, as ffn.x_hat's bound says;
# tiny measured 5e-4 to 1e-3); the routed ids are checked exactly (check's routing invariants)
BOUNDS = DENSE_BOUNDS | {"moe.weights": 1e-2}

# an expert's down GEMV: one K slice of whole block_k tiles, and its output tile (32768 // I, at most 128 rows) a
# power of two: I up to 256 a power of two, or a multiple of 128 from 512 up (block_n_down 0, the default)
EXPERT_DOWN = Rule(
    lambda i: (16 <= i <= 256 and is_power_of_two(i)) or (i >= 512 and i % 128 == 0),
    "a power of two from 16 to 256, or a multiple of 128 from 512 up",
)
MOE_DIMS = (
    Dim("moe.intermediate_size", EXPERT_DOWN, "an expert's down GEMV: its K and output tiles", per_rank=True),
    Dim("moe.n_group", exactly(1), "the launch routes by a plain top-k, with no expert groups"),
)
DIMS = LAYER_DIMS + KDA_DIMS + MOE_DIMS
