"""The `model` kind: one whole decode step (embed, the model's layers in order, tail). Its facts.

A step is its parts' launches chained on one stream (`harness.py`): each part its own kind's launch with that
kind's knobs (tuned file, defaults), so the step takes the runtime's `grid`, handed to every part, and how the
parts' launches chain.
"""

from glm53ctl.kernels.kinds import dense, kda, sparse
from glm53ctl.kernels.kinds.base import Knob
from glm53ctl.kernels.kinds.dims import Dim, exactly

# the layer shapes (attention, FFN) the layer kinds run
LAYER_SHAPES = (dense.LAYER, kda.LAYER, sparse.LAYER)

KNOBS = (
    Knob(
        "launch",
        ("parts", "persistent", "stages"),
        "parts",
        "schedule",
        "every part's knob `launch`: its own kind's (parts), or this one handed to every part",
    ),
    # chain: plain stream order measured 1.1% (TP8 rows 1) and 0.7% (rows 8) faster than PDL on the H200 at 4K
    # (docs/perf/model.md): a persistent launch fills every SM, so the next one cannot start early anyway
    Knob(
        "chain",
        ("pdl", "stream"),
        "stream",
        "schedule",
        "the parts' launches one after another on the stream (stream), or chained by programmatic dependent "
        "launch (pdl): each starts while the one before ends, asks L2 for its first weights, then waits for it",
    ),
)
RUNTIME = ("grid",)
RUNTIME_DEFAULTS: dict = {}
# the bounds of a step's outputs by the name's end: each layer's H, the states it writes, the logits (harness.py
# `bounds` names them per layer)
# (each layer's own error is its kind's check; a step carries every earlier layer's error: on tiny's 8 layers
# H's grows about 2e-3 a layer, to 1.8e-2 at the logits)
BOUNDS = {
    "H": 5e-2,
    "moe.weights": 2e-2,
    "logits": 5e-2,
    "h_hat": 5e-2,
    "kda.conv": 5e-2,
    "kda.recurrent": 5e-2,
    "dsa.latent": 5e-2,
    "dsa.index_key": 5e-2,
    "dsa.index_gate": 5e-2,
    "dsa.pooled_key": 5e-2,
}


def _uncovered(spec) -> int:
    """The step's layers whose shape (attention, FFN) no layer kind's kernels run: a DSA layer with the dense MLP."""
    return sum(1 for shape in spec.layers if shape not in LAYER_SHAPES)


# every layer of the step is one of the layer kinds' shapes (the first DSA layer comes after the dense ones)
DIMS = (
    Dim(
        "model.first_dense_layers",
        exactly(0),
        "every layer is one a layer kind runs: no DSA layer with the dense MLP",
        of=_uncovered,
        named="layers no layer kind runs",
    ),
)
