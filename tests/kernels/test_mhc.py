"""mHC task bodies (gate: hc_pre + Sinkhorn + RMSNorm; hc_post) against naive.py, under the interpreter."""

import pytest
import torch

from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.mhc import naive
from glm53ctl.kernels.ops.mhc.kernel import gate, hc_post
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from tests.helpers import assert_close

pytestmark = pytest.mark.interpreter


@pytest.fixture(scope="module")
def spec():
    return load_model("tiny")


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_gate_against_the_reference(spec, rows):
    torch.manual_seed(rows)
    w = Weights(spec, seed=rows).layer(0)
    H = (torch.randn(rows, 4, spec.hidden) + torch.randn(rows, 1, spec.hidden)).to(torch.bfloat16)
    args = (w["hc_attn_fn"], w["hc_attn_base"], w["hc_attn_scale"], w["input_layernorm.weight"])
    x_hat, post, comb = gate(H, *args, spec)
    ref_x, ref_post, ref_comb = naive.gate(H.float(), *args, spec, FP32)
    assert_close("post", ref_post, post, 1e-5)
    assert_close("comb", ref_comb, comb, 1e-5)
    assert_close("x_hat", ref_x, x_hat.float(), 1e-2)  # bf16: an ulp where the fp32 sums round apart
    # Sinkhorn converged: columns sum to 1, rows nearly
    assert torch.allclose(comb.sum(-2), torch.ones(rows, 4), atol=1e-4)


@pytest.mark.parametrize("rows", [1, 4])
def test_hc_post_against_the_reference(spec, rows):
    torch.manual_seed(10 + rows)
    H = torch.randn(rows, 4, spec.hidden).to(torch.bfloat16)
    a = torch.randn(rows, spec.hidden)
    post = 2 * torch.rand(rows, 4)
    comb = torch.rand(rows, 4, 4)
    out = hc_post(a, H, post, comb)
    ref = naive.hc_post(a, H.float(), post, comb, FP32)
    assert_close("H", ref, out.float(), 1e-2)
    assert (out.float() == ref).float().mean() > 0.95  # mostly the same bf16 bits
