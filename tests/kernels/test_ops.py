"""The ops' plain launches against their references, and against the kinds: each plain launch runs the very
bodies a launch kind runs, so where a kind computes the same thing it gives the same bits."""

import pytest
import torch

from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.embed import naive as embed_naive
from glm53ctl.kernels.ops.embed.kernel import gather, reduce_streams
from glm53ctl.kernels.ops.gemv.kernel import gemv
from glm53ctl.kernels.ops.gemv.naive import gemv_reference
from glm53ctl.kernels.ops.mhc.kernel import gate, hc_post
from glm53ctl.kernels.ops.tail import naive as tail_naive
from glm53ctl.kernels.ops.tail.kernel import final_norm
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import ROOT, Weights
from tests.helpers import assert_close, resolved

pytestmark = pytest.mark.interpreter


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=21)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_embed_gather_and_reduce_against_the_reference(weights, tp):
    spec = weights.spec
    tokens = torch.randint(0, spec.model.vocab_size, (3,), generator=torch.Generator().manual_seed(tp))
    parts = []
    for rank in range(tp):
        table = weights.shard(f"{ROOT}embed_tokens.weight", rank, tp).contiguous()
        part = gather(tokens, table, rank, chunk=64)
        assert torch.equal(part, embed_naive.embed_partial(tokens, table, rank, FP32))
        parts.append(part)
    H = reduce_streams(torch.stack(parts), spec.mhc.streams, chunk=64)
    ref = embed_naive.streams(sum(parts), spec.mhc.streams, FP32)
    assert torch.equal(H.float(), ref.float())


@pytest.mark.parametrize("rows", [1, 5])
def test_final_norm_against_the_reference(weights, rows):
    spec = weights.spec
    H = torch.randn(rows, spec.mhc.streams, spec.hidden, generator=torch.Generator().manual_seed(rows))
    H = H.to(torch.bfloat16)
    norm_w = weights.shard(f"{ROOT}norm.weight")
    h_hat, rstd = final_norm(H, norm_w, spec.model.rms_norm_eps)
    ref = tail_naive.final_norm(H.float(), norm_w, spec.model.rms_norm_eps, FP32)
    assert_close("h_hat", ref, h_hat.float(), 1e-2)
    h = H.float().mean(dim=1)
    assert_close("1/RMS", torch.rsqrt(h.pow(2).mean(-1) + spec.model.rms_norm_eps), rstd, 1e-6)


@pytest.mark.parametrize(("rows", "n", "k"), [(1, 40, 64), (7, 130, 256)])
def test_gemv_against_the_reference(rows, n, k):
    g = torch.Generator().manual_seed(rows + n)
    x = torch.randn(rows, k, generator=g).to(torch.bfloat16)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16)
    y = gemv(x, w, block_n=32, block_k=64)
    # fp32 sums over K tiles: within fp32 rounding; one K tile (the interpreter sums it in fp64): the same bits
    assert_close("y", gemv_reference(x, w), y, 1e-6)
    assert torch.equal(y, gemv_reference(x, w)) == (k == 64)


def test_the_mhc_plain_launches_give_the_dense_kinds_bits(weights):
    """The plain gate and hc_post run the bodies of dense's gate, comb and reduce tasks: the same bits as the
    launch's attn.x_hat, attn.post, attn.comb and attn.H (norm "task": the launch stores x̂ for the GEMV)."""
    from glm53ctl.kernels.kinds.dense.harness import DenseHarness

    k = DenseHarness(weights, resolved("dense", 1, 2, {"grid": 3, "norm": "task"}))
    x = k.inputs(seed=4)[0]
    out = k(x, poison=True)
    w, ch = k.w[0], k.launch.d.CH
    x_hat, post, comb = gate(x.H, w["fn_a"], w["base_a"], w["scale_a"], w["norm_a"], weights.spec, chunk=ch)
    assert torch.equal(x_hat, out["attn.x_hat"]) and torch.equal(post, out["attn.post"])
    assert torch.equal(comb, out["attn.comb"])
    H1 = hc_post(out["attn.out"], x.H, out["attn.post"], out["attn.comb"], chunk=ch)
    assert torch.equal(H1, out["attn.H"])


def test_swiglu_against_the_reference():
    """The ffn op's plain launch of `swiglu_act` (the body dense's gate/up tasks run): the clamped SwiGLU of
    swiglu_mlp, rounded to bf16 as the down projection reads it; values past the limit on both sides."""
    from glm53ctl.kernels.ops.ffn.kernel import swiglu

    limit = load_model("tiny").moe.swiglu_limit
    gu = 3 * limit * torch.randn(5, 2 * 128, generator=torch.Generator().manual_seed(3))
    g, u = gu.split(128, dim=1)
    ref = (torch.nn.functional.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)).to(torch.bfloat16)
    assert (g > limit).any() and (u < -limit).any()
    assert_close("act", ref.float(), swiglu(gu, limit).float(), 1e-2)


def test_a_chain_of_hand_offs_runs_and_its_stuck_site_is_named():
    """The runtime's chain (one hop a task, what measures a hand-off's latency on a GPU): every hop published,
    by flag and by box; a stuck hop is named and the next launch is clean."""
    from glm53ctl.kernels.runtime import LaunchFault
    from glm53ctl.kernels.runtime.chain import ChainLaunch

    for handoff in ("flag", "box"):
        chain = ChainLaunch(12, handoff, poll=1, grid=3, device="cpu")
        chain()
        published = chain.runtime.flags if handoff == "flag" else chain.runtime.boxes
        assert chain.runtime.epoch == 1 and int(published.eq(1).sum()) == 11  # every hop but the last, waited on
        with pytest.raises(LaunchFault) as e:
            chain(stuck_site=5, budget_ns=10**6)
        assert e.value.site == 5 and "hop" in e.value.task
        chain()
        assert chain.runtime.epoch == 3
