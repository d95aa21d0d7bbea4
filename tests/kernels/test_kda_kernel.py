"""The KDA core task body (conv, gate, delta rule, gated RMSNorm) against naive.py, under the interpreter."""

import pytest
import torch

from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.kda.kernel import kda_core
from glm53ctl.kernels.ops.kda.naive import delta_rule_step, gated_rmsnorm, l2norm, safe_gate, short_conv_step
from glm53ctl.kernels.spec import load_model
from tests.helpers import assert_close

pytestmark = pytest.mark.interpreter


def reference(u, b, f, og, conv, S, conv_w, A_log, dt_bias, o_norm_w, spec):
    R, H = b.shape
    K = spec.kda.head_dim
    P = H * K
    y, conv_new = short_conv_step(u, conv, conv_w[:, None, :], FP32)
    qt, kt, vt = (t.reshape(R, H, K) for t in y.split(P, dim=-1))
    g = safe_gate(f.reshape(R, H, K), A_log, dt_bias, spec.kda.gate_lower_bound)
    o, S_new = delta_rule_step(l2norm(qt) * K**-0.5, l2norm(kt), vt, g, torch.sigmoid(b), S)
    z = gated_rmsnorm(o, og.reshape(R, H, K), o_norm_w.float(), spec.model.rms_norm_eps)
    return z.reshape(R, P), conv_new, S_new


@pytest.mark.parametrize("model, heads, rows", [("tiny", 8, 1), ("tiny", 2, 3), ("glm53_flash", 2, 2)])
def test_kda_core_against_the_reference(model, heads, rows):
    """tiny's heads (K=16), and two of glm53_flash's heads (K=128: a rank's slice at any TP)."""
    spec = load_model(model)
    K, W = spec.kda.head_dim, spec.kda.conv_kernel
    P = heads * K
    g = torch.Generator().manual_seed(rows * 100 + heads)
    rnd = lambda *s: torch.randn(*s, generator=g)
    u, b, f, og = rnd(rows, 3 * P), rnd(rows, heads), rnd(rows, P), rnd(rows, P)
    conv = rnd(rows, W - 1, 3 * P).to(torch.bfloat16).float()
    S = 0.1 * rnd(rows, heads, K, K)
    conv_w, A_log = 0.5 * rnd(3 * P, W), torch.rand(heads, generator=g) * 2.7
    dt_bias, o_norm_w = 0.5 * rnd(P), (1 + 0.1 * rnd(K)).to(torch.bfloat16)
    z, conv_new, S_new = kda_core(u, b, f, og, conv, S, conv_w, A_log, dt_bias, o_norm_w, spec)
    rz, rconv, rS = reference(u, b, f, og, conv, S, conv_w, A_log, dt_bias, o_norm_w, spec)
    assert_close("S", rS, S_new, 1e-5)
    assert_close("z", rz, z.float(), 1e-2)
    assert torch.equal(conv_new.float(), rconv)  # raw inputs shifted, the current one rounded to bf16
