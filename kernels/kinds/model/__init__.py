"""The `model` kind: one whole decode step (embed, the model's layers in order, tail). Its facts.

A step is its parts' launches chained on one stream (`harness.py`): each part its own kind's launch with that
kind's knobs (tuned file, defaults), so the step takes only the runtime's `grid`, handed to every part.
"""

KNOBS = ()
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
