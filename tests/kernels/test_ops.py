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
from tests.helpers import assert_close

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
    assert torch.isfinite(rstd).all() and (rstd > 0).all()


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
    from glm53ctl.kernels.kinds.dense.harness import DenseKind

    k = DenseKind(weights, 1, 2, {"grid": 3, "norm": "task"}, "cpu")
    x = k.inputs(seed=4)[0]
    out = k(x, poison=True)
    w, ch = k.w[0], k.launch.d.CH
    x_hat, post, comb = gate(x.H, w["fn_a"], w["base_a"], w["scale_a"], w["norm_a"], weights.spec, chunk=ch)
    assert torch.equal(x_hat, out["attn.x_hat"]) and torch.equal(post, out["attn.post"])
    assert torch.equal(comb, out["attn.comb"])
    H1 = hc_post(out["attn.out"], x.H, out["attn.post"], out["attn.comb"], chunk=ch)
    assert torch.equal(H1, out["attn.H"])
