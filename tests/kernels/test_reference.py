"""The whole-step reference: mHC, router, embed, tail, TP against TP1, decode against prefill."""

import math

import pytest
import torch

from glm53ctl.errors import UsageError
from glm53ctl.kernels.kinds.harness import RunKey, row_contexts
from glm53ctl.kernels.kinds.run_key import run_reference
from glm53ctl.kernels.numerics import FP64, rel_rms
from glm53ctl.kernels.ops.ffn.naive import route, swiglu_mlp, topk_ordered
from glm53ctl.kernels.ops.mhc.naive import hc_post, hc_pre, sinkhorn
from glm53ctl.kernels.reference import Reference, empty_state
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import ROOT, Weights


@pytest.fixture(scope="module")
def spec():
    return load_model("tiny")


@pytest.fixture(scope="module")
def weights(spec):
    return Weights(spec, seed=7)


# ---- mHC (traps 10, 11) --------------------------------------------------------------------


def test_sinkhorn_starts_with_a_column_normalisation():
    torch.manual_seed(42)
    logits = torch.randn(4, 4, dtype=torch.float64)
    c1 = sinkhorn(logits, 1, 1e-6)
    # one iteration = softmax rows, then columns only: columns sum to 1, rows in general do not
    assert torch.allclose(c1.sum(0), torch.ones(4, dtype=torch.float64), atol=1e-5)
    assert not torch.allclose(c1.sum(1), torch.ones(4, dtype=torch.float64), atol=1e-3)
    c20 = sinkhorn(logits, 20, 1e-6)
    assert torch.allclose(c20.sum(0), torch.ones(4, dtype=torch.float64), atol=1e-5)
    assert torch.allclose(c20.sum(1), torch.ones(4, dtype=torch.float64), atol=1e-3)


def test_hc_post_uses_comb_transposed():
    torch.manual_seed(42)
    H = torch.randn(1, 4, 8, dtype=torch.float64)
    comb = torch.rand(1, 4, 4, dtype=torch.float64)
    post = torch.zeros(1, 4, dtype=torch.float64)
    out = hc_post(torch.zeros(1, 8, dtype=torch.float64), H, post, comb, FP64)
    # H_new[j] = sum_i C[i, j] H[i]
    assert torch.allclose(out[0], comb[0].t() @ H[0])
    assert not torch.allclose(out[0], comb[0] @ H[0])


def test_hc_pre_post_range_and_index_convention(spec, weights):
    torch.manual_seed(42)
    w = weights.layer(0)
    H = torch.randn(3, 4, spec.hidden, dtype=torch.float64)
    x, post, comb = hc_pre(
        H,
        w["hc_attn_fn"],
        w["hc_attn_base"],
        w["hc_attn_scale"],
        streams=4,
        iters=20,
        hc_eps=1e-6,
        norm_eps=1e-5,
        num=FP64,
    )
    assert ((post > 0) & (post < 2)).all()
    # C[i, j] comes from mix[8 + 4 i + j]: recompute by hand for row 0
    f = H[0].reshape(-1)
    f = f / torch.sqrt(f.pow(2).mean() + 1e-5)
    mix = w["hc_attn_fn"].double() @ f
    base, scale = w["hc_attn_base"].double(), w["hc_attn_scale"].double()
    logits = torch.tensor([[mix[8 + 4 * i + j] * scale[2] + base[8 + 4 * i + j] for j in range(4)] for i in range(4)])
    assert torch.allclose(comb[0], sinkhorn(logits.double(), 20, 1e-6))
    pre = torch.sigmoid(mix[:4] * scale[0] + base[:4]) + 1e-6
    assert torch.allclose(x[0], (pre[:, None] * H[0]).sum(0))


def test_tail_is_the_plain_mean_of_the_streams(spec, weights):
    torch.manual_seed(42)
    ref = Reference(weights, 1, FP64)
    H = torch.randn(2, 4, spec.hidden, dtype=torch.float64)
    out = ref.tail(H)
    h = H.mean(1)
    h_hat = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * weights.shard(f"{ROOT}norm.weight").double()
    assert rel_rms(h_hat @ weights.shard("lm_head.weight").double().t(), out["logits"]) < 1e-12


# ---- FFN and router (trap 9) -----------------------------------------------------------------


def test_swiglu_is_clamped_before_the_product():
    x = torch.ones(1, 1, dtype=torch.float64)
    wg = torch.tensor([[30.0], [-30.0]], dtype=torch.float64)
    wu = torch.tensor([[30.0], [-30.0]], dtype=torch.float64)
    wd = torch.eye(2, dtype=torch.float64)
    y = swiglu_mlp(x, wg, wu, wd, 10.0, FP64)
    silu = lambda v: v / (1 + math.exp(-v))
    # gate only from above (min), up both ways
    assert torch.allclose(y[0], torch.tensor([silu(10.0) * 10.0, silu(-30.0) * -10.0], dtype=torch.float64))


def test_router_bias_selects_but_does_not_weight(spec):
    torch.manual_seed(42)
    E = spec.moe.experts
    x = torch.randn(4, spec.hidden, dtype=torch.float64)
    W = torch.randn(E, spec.hidden, dtype=torch.float64) / spec.hidden**0.5
    bias = torch.zeros(E, dtype=torch.float64)
    bias[:4] = 100.0  # forces experts 0..3
    ids, w = route(x, W, bias, spec, FP64)
    assert (ids == torch.arange(4)).all()
    s = torch.sigmoid(x @ W.t())[:, :4]
    assert torch.allclose(w, s / s.sum(-1, keepdim=True) * 2.5)
    assert torch.allclose(w.sum(-1), torch.full((4,), 2.5, dtype=torch.float64))


def test_routing_picks_distinct_experts_with_weights_summing_to_the_scale(spec, weights):
    out = run_reference(Reference(weights, 2), RunKey("kda", 2, 8, context=5))
    ids, w = out["outputs.moe.ids"], out["outputs.moe.weights"]
    assert ids.shape == (8, spec.moe.top_k)
    assert all(len(set(r.tolist())) == spec.moe.top_k for r in ids)
    assert ((ids >= 0) & (ids < spec.moe.experts)).all()
    assert torch.allclose(w.sum(-1), torch.full((8,), spec.moe.routed_scaling_factor), atol=1e-5)


def test_topk_ties_break_by_index():
    s = torch.tensor([[0.0, 1.0, 0.0, 1.0, 0.0]])
    assert topk_ordered(s, 3).tolist() == [[1, 3, 0]]


# ---- embed --------------------------------------------------------------------------------


def test_embed_vocab_parallel_equals_the_gather(spec, weights):
    tokens = torch.tensor([0, 5, spec.model.vocab_size - 1, 300])
    table = weights.shard(f"{ROOT}embed_tokens.weight").double()
    for tp in (1, 2, 4, 8):
        H = Reference(weights, tp, FP64).embed(tokens)["H"]
        assert torch.equal(H, table[tokens][:, None, :].expand(-1, 4, -1))


def test_token_out_of_range_is_a_clear_error(spec, weights):
    with pytest.raises(UsageError, match=f"token id {spec.model.vocab_size} is out of range"):
        Reference(weights).embed(torch.tensor([1, spec.model.vocab_size]))


# ---- TP against TP1, decode against prefill --------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_whole_step_at_tp_equals_tp1(spec, weights, tp):
    """Rank-by-rank shards and the reduce give the TP1 step (fp64, tight), rows at different contexts."""
    ref1, refT = Reference(weights, 1, FP64), Reference(weights, tp, FP64)
    key = RunKey("model", 1, 3, context=41, steps=2, seed=tp)
    a, b = run_reference(ref1, key), run_reference(refT, key)
    assert a.keys() == b.keys()
    for name in a:
        if a[name].is_floating_point():
            assert rel_rms(a[name], b[name]) < 1e-12, name
        else:
            assert torch.equal(a[name], b[name]), name


def test_decode_equals_prefill_over_the_whole_model(spec, weights):
    """Step by step from empty state vs the independent sequence-shaped path: the last step agrees (fp64)."""
    torch.manual_seed(42)
    T = 2 * spec.index_width  # past the selection width: pools really drop
    tokens = torch.randint(0, spec.model.vocab_size, (T,))
    ref = Reference(weights, 2, FP64)
    state = empty_state(spec, 1, T, FP64)
    for t in range(T):
        out, state = ref.step(tokens[t : t + 1], state)
    pre, pstate = Reference(weights, 1, FP64).prefill(tokens)
    assert rel_rms(pre["logits"][-1:], out["logits"]) < 1e-10
    for i in range(spec.model.num_layers):
        assert rel_rms(pre[f"layers.{i}.H"][-1:], out[f"layers.{i}.H"]) < 1e-10
    for name, t in pstate.tensors().items():
        assert rel_rms(t, state.tensors()[name]) < 1e-10, name
    dsa = [i for i, (a, _) in enumerate(spec.layers) if a == "dsa"]
    for i in dsa:
        idx = out[f"layers.{i}.dsa.idx"][0]
        assert torch.equal(pre[f"layers.{i}.dsa.idx"][-1], idx)
        assert int((idx >= 0).sum()) < T  # some pools were dropped


def test_activations_stay_realistic_through_many_layers_and_steps(spec):
    """A tiny-width model with glm53_flash's 45 layers, 12 steps: H finite, neither blowing up nor collapsing."""
    deep = spec.model_copy(update={"model": spec.model.model_copy(update={"num_layers": 45})})
    ref = Reference(Weights(deep, seed=3))
    state = empty_state(deep, 2, 16)
    gen = torch.Generator().manual_seed(0)
    for _ in range(12):
        out, state = ref.step(torch.randint(0, deep.model.vocab_size, (2,), generator=gen), state)
        for i in range(45):
            rms = out[f"layers.{i}.H"].pow(2).mean().sqrt().item()
            assert math.isfinite(rms) and 0.1 < rms < 100, (i, rms)
        logits = out["logits"]
        assert torch.isfinite(logits).all() and 0.1 < logits.std().item() < 100
    for t in state.tensors().values():
        assert torch.isfinite(t).all()


def test_row_contexts_differ_in_position_and_pool_phase():
    c = row_contexts(40, 4, 4)
    assert c == [40, 37, 34, 31] and len({x % 4 for x in c}) == 4


def test_run_reference_rejects_bad_keys(spec, weights):
    ref = Reference(weights)
    with pytest.raises(UsageError, match="unknown kind"):
        run_reference(ref, RunKey("attn", 1, 1))
    with pytest.raises(UsageError, match="rows 9 is out of range"):
        run_reference(ref, RunKey("tail", 1, 9))
    with pytest.raises(UsageError, match="layer 3 of 'tiny' is dsa\\+moe, not a kda layer"):
        run_reference(ref, RunKey("kda", 1, 1, layer=3))


def test_moe_scales_routed_experts_only(spec, weights):
    """Trap 9: y = sum_e w_e * Expert_e(x) + Shared(x), the shared expert unscaled."""
    from glm53ctl.kernels.ops.ffn.naive import moe

    torch.manual_seed(42)
    w = weights.layer(3).sub("mlp.")
    x = torch.randn(2, spec.hidden, dtype=torch.float64)
    y, ids, wts = moe(x, w, spec, FP64)
    lim = spec.moe.swiglu_limit
    mlp = lambda p, xr: swiglu_mlp(
        xr, w[f"{p}gate_proj.weight"], w[f"{p}up_proj.weight"], w[f"{p}down_proj.weight"], lim, FP64
    )
    for r in range(2):
        want = mlp("shared_experts.", x[r : r + 1])[0]
        for slot, e in enumerate(ids[r].tolist()):
            want = want + wts[r, slot] * mlp(f"experts.{e}.", x[r : r + 1])[0]
        assert rel_rms(want, y[r]) < 1e-12
