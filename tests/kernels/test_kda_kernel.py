"""The KDA core task body (conv, gate, delta rule, gated RMSNorm) against naive.py, under the interpreter."""

import pytest
import torch
import triton
import triton.language as tl

from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.kda.kernel import (
    BV,
    SCRATCH,
    kda_core,
    kda_head,
    kda_head_loads,
    kda_head_of,
    kda_norm,
    kda_norm_of,
)
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


@triton.jit
def _head_kernel(u, beta, f, conv_in, conv_out, conv_w, A_log, dt_bias, S_in, S_out, scr, lower_bound,
                 H: tl.constexpr, K: tl.constexpr, W: tl.constexpr, NV: tl.constexpr, EARLY: tl.constexpr,
                 WRITE_STATE: tl.constexpr, INTERPRET: tl.constexpr):  # fmt: skip
    """Program (head h, part) of row 0: `kda_head`, or (EARLY, knob kda_loads=early) its loads first and then
    `kda_head_of`."""
    h, part = tl.program_id(0), tl.program_id(1)
    P: tl.constexpr = H * K
    b_f = tl.load(f + h * K + tl.arange(0, K))
    if EARLY:
        loads = kda_head_loads(u, 3 * P, P, K, conv_in, conv_w, A_log, dt_bias, S_in, 0, h, part, H, K, W, NV)
        kda_head_of(loads, tl.load(beta + h), b_f, u, 3 * P, P, K, conv_in, conv_out, S_out, scr, 0, h, part,
                    lower_bound, H, K, W, NV, INTERPRET, WRITE_STATE)  # fmt: skip
    else:
        kda_head(u, 3 * P, P, K, tl.load(beta + h), b_f, conv_in, conv_out, conv_w, A_log, dt_bias, S_in, S_out, scr,
                 0, h, part, lower_bound, H, K, W, NV, INTERPRET, WRITE_STATE)  # fmt: skip


@triton.jit
def _norm_kernel(scr, og, o_norm_w, z, eps, H: tl.constexpr, K: tl.constexpr, EARLY: tl.constexpr,
                 INTERPRET: tl.constexpr):  # fmt: skip
    """Program (head h) of row 0: `kda_norm`, or `kda_norm_of` of the norm's weight loaded first."""
    h = tl.program_id(0)
    b_og = tl.load(og + h * K + tl.arange(0, K))
    if EARLY:
        w = tl.load(o_norm_w + tl.arange(0, K)).to(tl.float32)
        kda_norm_of(scr, b_og, w, z, 0, h, eps, H, K, INTERPRET)
    else:
        kda_norm(scr, b_og, o_norm_w, z, 0, h, eps, H, K, INTERPRET)


@pytest.mark.parametrize("write_state", [True, False])
def test_the_early_loads_body_gives_kda_heads_bits_at_glm53_flash_width(write_state):
    """Knob kda_loads=early at head_dim 128 (where 1/sqrt(K) is inexact) and 4 parts a head (a part one 32-column
    block, the path it takes): `kda_head_loads` + `kda_head_of` and `kda_norm_of` give `kda_head`'s and
    `kda_norm`'s bits, the state written in the task or deferred."""
    spec = load_model("glm53_flash")
    H, K, W, NV = 2, spec.kda.head_dim, spec.kda.conv_kernel, 4
    assert K // NV == min(BV.value, K // 4)  # the early path
    P = H * K
    g = torch.Generator().manual_seed(11)
    rnd = lambda *s: torch.randn(*s, generator=g)
    u, beta, f, og = rnd(3 * P), rnd(H), rnd(P), rnd(P)
    conv_in = rnd(W - 1, 3 * P).to(torch.bfloat16)
    conv_w, A_log, dt_bias, S_in = 0.5 * rnd(3 * P, W), torch.rand(H, generator=g) * 2.7, 0.5 * rnd(P), rnd(H, K, K)
    o_norm_w = (1 + 0.1 * rnd(K)).to(torch.bfloat16)
    outs = []
    for early in (False, True):
        conv_out, S_out = torch.full_like(conv_in, float("nan")), torch.full_like(S_in, float("nan"))
        scr, z = torch.full((SCRATCH.value, P), float("nan")), torch.full((P,), float("nan"), dtype=torch.bfloat16)
        _head_kernel[(H, NV)](u, beta, f, conv_in, conv_out, conv_w, A_log, dt_bias, S_in, S_out, scr,
                              spec.kda.gate_lower_bound, H=H, K=K, W=W, NV=NV, EARLY=early, WRITE_STATE=write_state,
                              INTERPRET=True)  # fmt: skip
        _norm_kernel[(H,)](scr, og, o_norm_w, z, spec.model.rms_norm_eps, H=H, K=K, EARLY=early, INTERPRET=True)
        outs.append((scr, z, S_out, conv_out) if write_state else (scr, z))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                           b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32))  # fmt: skip
