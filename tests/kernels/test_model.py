"""The `model` kind on tiny under the interpreter: whole decode steps (embed, the 8 layers, tail), each part its
own kind's launch, against the reference over two steps; a stuck wait named by its layer and site."""

import pytest

from glm53ctl.kernels.checks import check_key, fault_key
from glm53ctl.kernels.kinds.model.harness import ModelHarness
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights

pytestmark = [pytest.mark.interpreter, pytest.mark.slow]


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=0)


def test_two_steps_against_the_reference(weights):
    """`check` of the step at TP1 rows 1: every layer's H, routing, selection, states and caches and the logits
    within bounds after two steps (the second reads what the first wrote), one other grid and a repeat bitwise."""
    res, out = check_key(weights, "model", 1, 1, 0, "cpu")
    assert res.ok, res.problems
    spec = weights.spec
    assert {f"layers.{i}.H" for i in range(spec.model.num_layers)} <= set(res.errors)
    assert "layers.3.dsa.idx" in out and "layers.4.moe.ids" in out and "logits" in out
    assert res.invariants["tag advanced once per launch"]


def test_a_stuck_wait_names_the_layer_and_the_retry_is_clean(weights):
    """A site of the first DSA layer's launch stuck: the fault names the step's site and the layer; the step
    retried gives the clean step's bits."""
    k = ModelHarness(weights, 1, 1, None, "cpu", steps=1)
    j = next(j for j, (name, _) in enumerate(k.launch.parts) if name == "layers.3")
    site = k.launch.offsets[j] + 1
    res = fault_key(weights, "model", 1, 1, "cpu", site, int(2e6), 600.0)
    assert res.ok and res.named == 1, res.problems


def test_step_sites_map_to_their_part(weights):
    k = ModelHarness(weights, 2, 1, None, "cpu", steps=1)
    assert len(k.launch.parts) == weights.spec.model.num_layers + 2
    for j, (_, h) in enumerate(k.launch.parts):
        first = k.launch.offsets[j]
        assert k.launch.locate(first) == (j, 0)
        assert k.launch.locate(first + len(h.launch.table.sites) - 1) == (j, len(h.launch.table.sites) - 1)
