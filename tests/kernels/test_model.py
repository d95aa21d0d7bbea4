"""The `model` kind on tiny under the interpreter: whole decode steps (embed, the 8 layers, tail), each part its
own kind's launch, against the reference over two steps; a stuck wait named by its layer and site."""

import pytest
import torch

from glm53ctl.kernels.checks import check_key, fault_key
from glm53ctl.kernels.kinds.model.harness import ModelHarness
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from tests.helpers import resolved

pytestmark = [pytest.mark.interpreter, pytest.mark.slow]


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=0)


def test_two_steps_against_the_reference(weights):
    """`check` of the step at TP1 rows 1: every layer's H, routing, selection, states and caches and the logits
    within bounds after two steps (the second reads what the first wrote), one other grid and a repeat bitwise."""
    res, out = check_key(weights, resolved("model", 1, 1), 0)
    assert res.ok, res.problems
    spec = weights.spec
    assert {f"layers.{i}.H" for i in range(spec.model.num_layers)} <= set(res.errors)
    assert "layers.3.dsa.idx" in out and "layers.4.moe.ids" in out and "logits" in out
    assert res.invariants["tag advanced once per launch"]


def test_a_stuck_wait_names_the_layer_and_the_retry_is_clean(weights):
    """A site of the first DSA layer's launch stuck: the fault names the step's site and the layer; the step
    retried gives the clean step's bits."""
    k = ModelHarness(weights, resolved("model", 1, 1), steps=1)
    j = next(j for j, (name, _) in enumerate(k.launch.parts) if name == "layers.3")
    site = k.launch.offsets[j] + 1
    res = fault_key(weights, resolved("model", 1, 1), site, int(2e6), 600.0)
    assert res.ok and res.named == 1, res.problems


def test_step_sites_map_to_their_part(weights):
    k = ModelHarness(weights, resolved("model", 2, 1), steps=1)
    assert len(k.launch.parts) == weights.spec.model.num_layers + 2
    for j, (_, h) in enumerate(k.launch.parts):
        first = k.launch.offsets[j]
        assert k.launch.locate(first) == (j, 0)
        assert k.launch.locate(first + len(h.launch.table.sites) - 1) == (j, len(h.launch.table.sites) - 1)


def test_layers_share_weights_where_a_step_does_not_fit(weights):
    """share_layers(2): each layer shape's layers read two layers' tensors in turn, and the harnesses of the layers
    that share hold one prepared copy of them; the CPU always takes every layer's own."""
    from glm53ctl.kernels.kinds.model.harness import _reuse_gap, weight_sets

    spec = weights.spec
    assert weight_sets(spec, 1, 1, "cpu", timing=True) is None
    shared = weights.share_layers(2)
    kda = [i for i, s in enumerate(spec.layers) if s == ("kda", "moe")]
    assert [shared.source_layer(i) for i in kda] == [kda[k % 2] for k in range(len(kda))]
    name = lambda i: f"model.language_model.layers.{i}.mlp.gate.weight"  # noqa: E731
    assert shared.shard(name(kda[2])) is shared.shard(name(kda[0]))
    assert not torch.equal(shared.shard(name(kda[1])), shared.shard(name(kda[0])))
    k = ModelHarness(shared, resolved("model", 2, 1), steps=1)
    parts = k.parts
    assert parts[f"layers.{kda[2]}"].w[1] is parts[f"layers.{kda[0]}"].w[1]
    assert parts[f"layers.{kda[1]}"].w[0] is not parts[f"layers.{kda[0]}"].w[0]
    # the bytes streamed between two reads of one layer's weights, the step replayed in turn
    assert _reuse_gap([None, 0, 1, 0, None], [5, 10, 20, 30, 7]) == 7 + 5  # layer 3 to layer 1, wrapping
    assert _reuse_gap([None, 0, 1, None], [5, 10, 20, 7]) == 7 + 5 + 10  # layer 2 to itself


def test_each_choice_is_proven_on_the_launchs_own_inputs(weights):
    """The step's routing and selection invariant: a choice that is the exact top-k of the scores of the x̂ (and
    caches) the layer saw passes; one expert or one pool swapped for the worst is named with its layer and step."""
    from glm53ctl.kernels.kinds.sparse.harness import CACHE_NAMES
    from glm53ctl.kernels.numerics import FP32
    from glm53ctl.kernels.ops.dsa.naive import dsa_attention
    from glm53ctl.kernels.ops.ffn.naive import route
    from glm53ctl.kernels.state import DsaCache

    spec = weights.spec
    k = ModelHarness(weights, resolved("model", 1, 2, None, context=4 * spec.index_width), steps=1)
    x = k.inputs(3)[0]
    gen = torch.Generator().manual_seed(5)
    moe_i = next(i for i, s in enumerate(spec.layers) if s == ("kda", "moe"))
    dsa_i = next(i for i, s in enumerate(spec.layers) if s[0] == "dsa")
    w_moe, w_dsa = weights.layer(moe_i), weights.layer(dsa_i)
    xm, xd = (torch.randn(2, spec.hidden, generator=gen).to(torch.bfloat16) for _ in range(2))
    ids, _ = route(xm.float(), w_moe["mlp.gate.weight"], w_moe["mlp.gate.e_score_correction_bias"], spec, FP32)
    caches = x.dsa[dsa_i]
    float_caches = DsaCache(*(getattr(caches, n).float() for n in CACHE_NAMES))
    idx = dsa_attention(xd.float(), w_dsa.sub("self_attn."), float_caches, x.pos, spec, FP32).idx
    k.seen = [{"pos": x.pos, f"layers.{moe_i}.ffn.x_hat": xm, f"layers.{dsa_i}.attn.x_hat": xd}]
    k.seen[0][f"layers.{dsa_i}.caches"] = caches
    k.chosen = [{f"layers.{moe_i}.moe.ids": ids.flip(-1), f"layers.{dsa_i}.dsa.idx": idx}]
    assert k.off_choices() == []
    worst = int(ids.new_tensor([e for e in range(spec.moe.experts) if e not in ids[0]])[-1])
    bad_ids = ids.clone()
    bad_ids[0, 0] = worst
    bad_idx = idx.clone()
    bad_idx[1, : spec.indexer.kpool] = idx[1, : spec.indexer.kpool] - spec.indexer.kpool  # another pool
    k.chosen = [{f"layers.{moe_i}.moe.ids": bad_ids, f"layers.{dsa_i}.dsa.idx": bad_idx}]
    assert k.off_choices() == [f"layers.{moe_i}.moe.ids (step 0)", f"layers.{dsa_i}.dsa.idx (step 0)"]


def test_the_steps_invariants_fail_on_a_broken_choice(weights):
    """What `check` proves of a step beyond the bounds, shown failing: a layer's routing that is not the exact
    top-k of the scores of its own inputs (one expert swapped for one not chosen), and a cache written elsewhere."""
    k = ModelHarness(weights, resolved("model", 8, 1), steps=1)
    out = k(k.inputs(seed=4)[0], poison=True)
    name = "every layer's routing and selection the exact top-k of its own inputs (near-ties followed)"
    assert k.invariants(out, {}) == {name: True, "caches written at each row's positions only": True}
    routed = next(n for n in k.chosen[0] if n.endswith("moe.ids"))
    ids = k.chosen[0][routed]
    other = next(e for e in range(weights.spec.moe.experts) if e not in ids[0].tolist())
    k.chosen[0][routed] = torch.cat([ids[:, :-1], torch.full_like(ids[:, -1:], other)], -1)
    assert k.invariants(out, {}) == {
        f"{name}: not at {routed} (step 0)": False,
        "caches written at each row's positions only": True,
    }
    k.chosen[0][routed], k.untouched = ids, False
    assert k.invariants(out, {}) == {name: True, "caches written at each row's positions only": False}
