"""The dense layer composed from the Triton task bodies (separate launches) against the reference layer."""

import pytest
import torch

from glm53ctl.kernels.harness import Inputs, layer_state
from glm53ctl.kernels.layers import dense_layer
from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.reference import Reference
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("rows", [1, 3])
def test_dense_layer_from_task_bodies_matches_the_reference(rows):
    spec = load_model("tiny")
    weights = Weights(spec, seed=rows)
    ref = Reference(weights, 1)
    inputs = Inputs(spec, seed=rows, num=ref.num)
    state = layer_state(ref, 0, [9 - 3 * r for r in range(rows)], inputs, 16)  # rows at different contexts
    H = inputs.H(rows)
    want, want_state = ref.layer(0, H, state)
    got, kda = dense_layer(H.to(torch.bfloat16), weights.layer(0), state.kda[0], spec)
    bounds = {"attn.post": 1e-5, "attn.comb": 1e-5, "ffn.post": 1e-3, "ffn.comb": 1e-3}
    for name, t in got.items():
        err = rel_rms(want[name], t.float())
        assert err <= bounds.get(name, 2e-2), (name, err)
    assert rel_rms(want_state.kda[0].recurrent, kda.recurrent) <= 1e-3
    assert rel_rms(want_state.kda[0].conv, kda.conv.float()) <= 1e-2
