"""The KDA attention reference (kernels/ops/kda/naive.py) against docs/model.md §4: decode vs prefill, the §11 traps,
TP sharding (§8), and flash-linear-attention's naive_recurrent_kda."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from glm53ctl.kernels.numerics import FP32, FP64, Numerics, rms_norm
from glm53ctl.kernels.ops.kda import (
    delta_rule_step,
    gated_rmsnorm,
    kda_attention,
    kda_attention_prefill,
    l2norm,
    safe_gate,
    short_conv_step,
)
from glm53ctl.kernels.spec import ModelSpec, load_model
from glm53ctl.kernels.state import KdaState
from tests.helpers import assert_close

TINY = load_model("tiny")
FLASH = load_model("glm53_flash")
_BY_HEAD_ROWS = ("q_proj", "k_proj", "v_proj", "f_b_proj", "g_b_proj", "q_conv1d", "k_conv1d", "v_conv1d")


# ---- fixtures ---------------------------------------------------------------------------------


def make_weights(spec: ModelSpec, tp: int = 1, v_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Random weights at one rank's shapes: linears bf16 ~ N(0, 1/in), the rest fp32 as in the checkpoint."""
    w = {}
    for name, shape in spec.shards(tp).weight_shapes()["kda"].items():
        if name.endswith("_proj.weight"):
            w[name] = (torch.randn(shape) * shape[1] ** -0.5).bfloat16()
        elif name.endswith("conv1d.weight"):
            w[name] = torch.randn(shape) * 0.5
        elif name == "A_log":
            w[name] = torch.empty(shape).uniform_(0.5, 8.0).log()
        elif name == "dt_bias":
            w[name] = torch.randn(shape) * 0.5
        else:
            w[name] = 1 + 0.1 * torch.randn(shape)
    # small v puts o_norm's eps in charge, so the size of o (hence the q scale) shows in the output
    w["v_proj.weight"] = (w["v_proj.weight"].float() * v_scale).bfloat16()
    return w


def zero_state(spec: ModelSpec, tp: int, rows: int) -> KdaState:
    shapes = spec.shards(tp).state_shapes(rows, 1)
    return KdaState(
        conv=torch.zeros(shapes["kda.conv"], dtype=torch.bfloat16),
        recurrent=torch.zeros(shapes["kda.recurrent"]),
    )


def random_x(T: int, R: int, spec: ModelSpec) -> torch.Tensor:
    """Published normalized rows [T, R, D], bf16-valued."""
    return torch.randn(T, R, spec.hidden).bfloat16()


def decode(xs, weights, spec, tp, num):
    """kda_attention over xs [T, R, D] from a zero state: (outs [T, R, D], final state)."""
    state = zero_state(spec, tp, xs.shape[1])
    outs = []
    for x in xs:
        out, state = kda_attention(x, weights, state, spec, num)
        outs.append(out)
    return torch.stack(outs), state


def shard_kda(weights, spec: ModelSpec, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slice (docs/model.md §8): per-head rows, o_proj columns by head, f_a/g_a/o_norm replicated."""
    Hl, K = spec.kda.heads // tp, spec.kda.head_dim
    h = slice(rank * Hl, (rank + 1) * Hl)
    c = slice(h.start * K, h.stop * K)
    out = {}
    for name, w in weights.items():
        if name.split(".")[0] in _BY_HEAD_ROWS or name == "dt_bias":
            out[name] = w[c]
        elif name in ("b_proj.weight", "A_log"):
            out[name] = w[h]
        elif name == "o_proj.weight":
            out[name] = w[:, c]
        else:
            out[name] = w
    return out


def unshard_state(states: list[KdaState]) -> KdaState:
    """Per-rank states back to TP1 layout: conv channels are q|k|v per rank, heads concatenate."""
    convs = [s.conv.chunk(3, dim=-1) for s in states]
    conv = torch.cat([torch.cat([c[i] for c in convs], dim=-1) for i in range(3)], dim=-1)
    return KdaState(conv=conv, recurrent=torch.cat([s.recurrent for s in states], dim=1))


# ---- decode vs prefill ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, tp, num, T, rel",
    [
        pytest.param(TINY, 1, FP64, 7, 1e-10, id="tiny-TP1-fp64-T7"),
        pytest.param(TINY, 2, FP64, 7, 1e-10, id="tiny-TP2-fp64-T7"),
        pytest.param(TINY, 4, FP64, 2, 1e-10, id="tiny-TP4-fp64-T2"),
        pytest.param(TINY, 8, FP64, 9, 1e-10, id="tiny-TP8-fp64-T9"),
        pytest.param(TINY, 1, FP32, 7, 1e-3, id="tiny-TP1-fp32-T7"),
        pytest.param(TINY, 8, FP32, 9, 1e-3, id="tiny-TP8-fp32-T9"),
        pytest.param(FLASH, 8, FP32, 5, 1e-3, id="flash-TP8-fp32-T5"),
    ],
)
def test_decode_matches_prefill(spec, tp, num, T, rel):
    torch.manual_seed(42)
    R = 2
    weights = make_weights(spec, tp)
    xs = random_x(T, R, spec)
    outs, state = decode(xs, weights, spec, tp, num)
    for r in range(R):
        ref, ref_state = kda_attention_prefill(xs[:, r], weights, spec, num)
        assert_close(f"out[r={r}]", ref, outs[:, r], rel)
        assert_close(f"out[r={r}, t=T-1]", ref[-1], outs[-1, r], rel)
        assert_close(f"recurrent[r={r}]", ref_state.recurrent[0], state.recurrent[r], rel)
        assert_close(f"conv[r={r}]", ref_state.conv[0], state.conv[r], rel)


def test_kda_attention_does_not_mutate():
    torch.manual_seed(1)
    weights = make_weights(TINY)
    x = random_x(1, 3, TINY)[0]
    shapes = TINY.shards(1).state_shapes(3, 1)
    state = KdaState(conv=torch.randn(shapes["kda.conv"]).bfloat16(), recurrent=torch.randn(shapes["kda.recurrent"]))
    before = (x.clone(), state.conv.clone(), state.recurrent.clone(), {k: v.clone() for k, v in weights.items()})
    _, new = kda_attention(x, weights, state, TINY, FP32)
    assert torch.equal(x, before[0]) and torch.equal(state.conv, before[1])
    assert torch.equal(state.recurrent, before[2])
    assert all(torch.equal(weights[k], v) for k, v in before[3].items())
    assert new.conv.shape == state.conv.shape and new.recurrent.shape == state.recurrent.shape


# ---- traps (docs/model.md §11, 6-8) ------------------------------------------------------------------


def test_delta_rule_decays_along_key_dim():
    torch.manual_seed(2)
    R, H, K = 2, 3, 8
    S = torch.randn(R, H, K, K, dtype=torch.float64)
    q, k, v = (torch.randn(R, H, K, dtype=torch.float64) for _ in range(3))
    g = -torch.rand(R, H, K, dtype=torch.float64) * 3
    # beta = 0: no update, the step is the decay alone
    _, S_new = delta_rule_step(q, k, v, g, torch.zeros(R, H, dtype=torch.float64), S)
    assert_close("S along key", S * g.exp()[..., :, None], S_new, 1e-14)
    assert (S_new - S * g.exp()[..., None, :]).abs().max() > 0.1


def test_delta_rule_output_uses_updated_state():
    torch.manual_seed(3)
    R, H, K = 2, 3, 8
    q, k, v = (torch.randn(R, H, K, dtype=torch.float64) for _ in range(3))
    g = -torch.rand(R, H, K, dtype=torch.float64)
    beta = torch.rand(R, H, dtype=torch.float64)
    # from S = 0 the old state reads 0, the updated one beta (q.k) v
    o, _ = delta_rule_step(q, k, v, g, beta, torch.zeros(R, H, K, K, dtype=torch.float64))
    assert_close("o from S=0", (beta * (q * k).sum(-1))[..., None] * v, o, 1e-14)
    S = torch.randn(R, H, K, K, dtype=torch.float64)
    o, S_new = delta_rule_step(q, k, v, g, beta, S)
    assert_close("o = S_new^T q", torch.einsum("rhkv,rhk->rhv", S_new, q), o, 1e-14)


def first_step(x, w, spec, variant="spec"):
    """Closed form of kda_attention's first step from a zero state (FP64): S = beta k v^T, o = beta (q.k) v.
    `variant` names one docs/model.md §11 trap done wrong."""
    w = {n: t.double() for n, t in w.items()}
    x = x.double()
    K, eps = spec.kda.head_dim, spec.model.rms_norm_eps
    R, H = x.shape[0], w["A_log"].shape[0]
    tap = 0 if variant == "conv_tap0" else -1
    heads = []
    for n in ("q", "k", "v"):
        u = x @ w[f"{n}_proj.weight"].t()
        heads.append(F.silu(u * w[f"{n}_conv1d.weight"][:, 0, tap]).reshape(R, H, K))
    qt, kt, v = heads
    if variant == "q_scale_first":
        q = qt * K**-0.5 / (qt.pow(2) * K**-1).sum(-1, keepdim=True).add(1e-6).sqrt()
    else:
        q = qt / qt.pow(2).sum(-1, keepdim=True).add(1e-6).sqrt() * K**-0.5
    k = kt / kt.pow(2).sum(-1, keepdim=True).add(1e-6).sqrt()
    beta = torch.sigmoid(x @ w["b_proj.weight"].t())
    o = (beta * (q * k).sum(-1))[..., None] * v
    if variant == "old_state":
        o = torch.zeros_like(o)
    og = ((x @ w["g_a_proj.weight"].t()) @ w["g_b_proj.weight"].t()).reshape(R, H, K)
    gate = F.silu(og) if variant == "silu_gate" else torch.sigmoid(og)
    z = o / o.pow(2).mean(-1, keepdim=True).add(eps).sqrt() * w["o_norm.weight"] * gate
    return z.reshape(R, H * K) @ w["o_proj.weight"].t()


@pytest.mark.parametrize("v_scale", [1.0, 1e-4], ids=["v1", "v1e-4"])
def test_first_step_closed_form(v_scale):
    torch.manual_seed(4)
    weights = make_weights(TINY, v_scale=v_scale)
    x = random_x(1, 3, TINY)[0]
    out, _ = kda_attention(x, weights, zero_state(TINY, 1, 3), TINY, FP64)
    assert_close("first step", first_step(x, weights, TINY), out, 1e-12)


@pytest.mark.parametrize("variant", ["q_scale_first", "old_state", "silu_gate", "conv_tap0"])
def test_first_step_trap_variants_differ(variant):
    """The closed form above tells each wrong variant apart (q scale: only once o_norm's eps dominates)."""
    torch.manual_seed(4)
    weights = make_weights(TINY, v_scale=1e-4)
    x = random_x(1, 3, TINY)[0]
    ref = first_step(x, weights, TINY)
    wrong = first_step(x, weights, TINY, variant)
    err = ((wrong - ref).pow(2).mean() / ref.pow(2).mean()).sqrt()
    assert err > 0.1, f"{variant}: rel {err:.2e}"


def test_safe_gate_not_softplus():
    torch.manual_seed(5)
    R, H, K, lb = 2, 4, 8, -5.0
    f = torch.randn(R, H, K, dtype=torch.float64) * 3
    A_log = torch.rand(H, dtype=torch.float64).log()
    dt_bias = torch.randn(H * K, dtype=torch.float64)
    g = safe_gate(f, A_log, dt_bias, lb)
    ref = lb * torch.sigmoid(A_log.exp()[:, None] * (f + dt_bias.reshape(H, K)))
    assert_close("safe gate", ref, g, 1e-15)
    assert ((g > lb) & (g < 0)).all()
    # saturates at the lower bound where the softplus form would be unbounded
    big = safe_gate(torch.full((1, H, K), 1e3, dtype=torch.float64), A_log, dt_bias, lb)
    assert torch.allclose(big, torch.full_like(big, lb))


def test_gated_rmsnorm_gate_is_sigmoid():
    torch.manual_seed(6)
    o, og = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    w = 1 + 0.1 * torch.randn(8)
    eps = 1e-5
    normed = o / o.pow(2).mean(-1, keepdim=True).add(eps).sqrt() * w.double()
    assert_close("gated rmsnorm", normed * torch.sigmoid(og), gated_rmsnorm(o, og, w, eps), 1e-15)
    # og = 0 halves the normed row (SiLU would zero it)
    assert_close("og = 0", normed / 2, gated_rmsnorm(o, torch.zeros_like(og), w, eps), 1e-15)
    assert_close("per head", rms_norm(o, w, eps) * torch.sigmoid(og), gated_rmsnorm(o, og, w, eps), 1e-15)


@pytest.mark.parametrize("tap", [0, 1, 3])
def test_short_conv_tap_order(tap):
    """weight[..., W-1] multiplies the current input, weight[..., 0] the oldest stored one."""
    torch.manual_seed(7)
    R, C, W = 2, 6, 4
    u = torch.randn(R, C)
    state = torch.randn(R, W - 1, C).bfloat16()
    weight = torch.zeros(C, 1, W)
    weight[:, 0, tap] = torch.randn(C)
    y, new = short_conv_step(u, state, weight, FP32)
    window = torch.cat([state.float(), u[:, None]], dim=1)  # [R, W, C]
    assert_close("y", F.silu(window[:, tap] * weight[:, 0, tap]), y, 1e-7)
    assert torch.equal(new[:, :-1], state[:, 1:].float())
    assert torch.equal(new[:, -1], u.bfloat16().float())
    _, new64 = short_conv_step(u, state, weight, FP64)
    assert torch.equal(new64[:, -1], u.double())


def test_l2norm_eps_inside_root():
    x = torch.full((3, 16), 1e-4, dtype=torch.float64)
    assert_close("l2norm", x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt(), l2norm(x), 1e-15)
    assert l2norm(torch.zeros(2, 4)).eq(0).all()


# ---- TP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_partials_sum_to_tp1(tp):
    torch.manual_seed(8)
    T, R = 3, 2
    full = make_weights(TINY)
    xs = random_x(T, R, TINY)
    ref, ref_state = decode(xs, full, TINY, 1, FP64)
    shapes = TINY.shards(tp).weight_shapes()["kda"]
    outs, states = [], []
    for rank in range(tp):
        w = shard_kda(full, TINY, tp, rank)
        assert {n: tuple(t.shape) for n, t in w.items()} == shapes
        out, state = decode(xs, w, TINY, tp, FP64)
        outs.append(out)
        states.append(state)
    assert_close(f"TP{tp} sum", ref, sum(outs), 1e-12)
    state = unshard_state(states)
    assert_close("recurrent", ref_state.recurrent, state.recurrent, 1e-12)
    assert_close("conv", ref_state.conv, state.conv, 1e-12)


# flash-linear-attention (fla-core, a declared test dependency): imported plainly, so a missing or broken
# install fails these tests instead of skipping them


def test_delta_rule_matches_fla_naive_recurrent_kda():
    from fla.ops.kda import naive as fla_naive

    torch.manual_seed(9)
    B, T, H, K = 2, 9, 3, 16
    scale = K**-0.5
    # fla layout: q, k, v, g [B, T, H, K] (g log-space decay), beta [B, T, H], state [B, H, K, V]
    q, k = l2norm(torch.randn(B, T, H, K)), l2norm(torch.randn(B, T, H, K))
    v = torch.randn(B, T, H, K)
    g = safe_gate(torch.randn(B, T, H, K), torch.rand(H).log(), torch.randn(H * K), -5.0)
    beta = torch.rand(B, T, H)
    S0 = torch.randn(B, H, K, K) * 0.1
    o_ref, S_ref = fla_naive.naive_recurrent_kda(
        q, k, v, g, beta, scale=scale, initial_state=S0, output_final_state=True
    )
    S, o = S0.double(), []
    for t in range(T):
        o_t, S = delta_rule_step(*(x[:, t].double() for x in (q * scale, k, v, g, beta)), S)
        o.append(o_t)
    # fla computes in fp32, ours in fp64
    assert_close("o vs fla", o_ref, torch.stack(o, dim=1), 1e-5)
    assert_close("S vs fla", S_ref, S, 1e-5)


def test_safe_gate_matches_fla_lowerbound_gate():
    from fla.ops.kda import gate as fla_gate

    torch.manual_seed(10)
    H, K = 4, 16
    f = torch.randn(2, 5, H, K)
    A_log, dt_bias = torch.rand(H).log(), torch.randn(H * K)
    ref = fla_gate.naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=-5.0)
    assert_close("safe gate vs fla", ref, safe_gate(f, A_log, dt_bias, -5.0), 1e-6)


def test_numerics_fp32_rounds_conv_state():
    """In FP32 the conv state holds bf16 values; in FP64 nothing is rounded (for the tight checks)."""
    torch.manual_seed(11)
    weights = make_weights(TINY)
    xs = random_x(2, 1, TINY)
    for num in (FP32, FP64, Numerics(torch.float32, None)):
        _, state = decode(xs, weights, TINY, 1, num)
        c = state.conv
        rounded = num.store_dtype is not None
        assert c.dtype == num.dtype
        assert torch.equal(c, c.bfloat16().to(c.dtype)) == rounded
