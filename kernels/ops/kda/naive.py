"""PyTorch reference of one KDA layer's attention part (docs/model.md §4): one decode step, and an independent
sequence form from a zero state (prefill).

Functional: inputs are never mutated. Everything is computed in `num.dtype`; weights arrive bf16/fp32
and are upcast. Only what a kernel stores in bf16 is rounded with `num.store`: the conv state and the
gated-RMSNorm output z handed to o_proj. The recurrent state S is stored fp32 by the kernel and is not
rounded. State layouts are those of `KdaState`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from glm53ctl.kernels.numerics import Numerics, linear, rms_norm
from glm53ctl.kernels.spec import ModelSpec
from glm53ctl.kernels.state import KdaState

_QKV = ("q", "k", "v")


def short_conv_step(
    u: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, num: Numerics
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv + SiLU for one token.

    u [R, C] raw projection output, conv_state [R, W-1, C] previous raw inputs (oldest first),
    weight [C, 1, W] with weight[..., W-1] on the current input. Returns (y [R, C], new_conv_state).
    """
    u, past = num.c(u), num.c(conv_state)
    window = torch.cat([past, u[:, None]], dim=1)  # [R, W, C]
    w = num.c(weight)[:, 0].t()  # [W, C]
    y = F.silu((window * w).sum(1))
    # the state keeps the last W-1 raw inputs as the kernel stores them (bf16)
    new_state = torch.cat([past[:, 1:], num.store(u)[:, None]], dim=1)
    return y, new_state


def safe_gate(f: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float) -> torch.Tensor:
    """g[h, i] = lower_bound * sigmoid(exp(A_log[h]) * (f[h, i] + dt_bias[h, i])), in (lower_bound, 0).

    f [..., H, K]; dt_bias [H*K] or [H, K]; A_log [H]. Computed in f's dtype.
    """
    H, K = f.shape[-2:]
    a = A_log.to(f.dtype).exp()[:, None]  # [H, 1]
    return lower_bound * torch.sigmoid(a * (f + dt_bias.to(f.dtype).reshape(H, K)))


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (eps inside the root, not max(norm, eps))."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def delta_rule_step(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, S: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One gated delta-rule step. q, k, g [R, H, K] (q already scaled), v [R, H, V], beta [R, H],
    S [R, H, K, V] with S[i = key, j = value]. Returns (o [R, H, V], S_new)."""
    # decay along the key dim: row i of S scaled by exp(g[i])
    S = S * g.exp()[..., None]
    r = torch.einsum("rhkv,rhk->rhv", S, k)  # [R, H, V] = S^T k
    delta = beta[..., None] * (v - r)  # [R, H, V]
    S = S + k[..., None] * delta[..., None, :]
    # the output reads the UPDATED state
    o = torch.einsum("rhkv,rhk->rhv", S, q)
    return o, S


def gated_rmsnorm(o: torch.Tensor, og: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per head over V: o * rsqrt(mean(o^2) + eps) * weight * sigmoid(og). o, og [..., H, V], weight [V]."""
    return rms_norm(o, weight, eps) * torch.sigmoid(og)


def _project(x: torch.Tensor, weights: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """The in-projections of x [N, D]: u = q|k|v raw [N, 3P], b [N, H], f [N, P], og [N, P]."""
    u = torch.cat([linear(x, weights[f"{n}_proj.weight"]) for n in _QKV], dim=-1)
    b = linear(x, weights["b_proj.weight"])
    f = linear(linear(x, weights["f_a_proj.weight"]), weights["f_b_proj.weight"])
    og = linear(linear(x, weights["g_a_proj.weight"]), weights["g_b_proj.weight"])
    return u, b, f, og


def _conv_weight(weights: Mapping[str, torch.Tensor], num: Numerics) -> torch.Tensor:
    """q, k, v conv weights concatenated in the order of u's channels: [3P, 1, W]."""
    return torch.cat([num.c(weights[f"{n}_conv1d.weight"]) for n in _QKV], dim=0)


def kda_attention(
    x_hat: torch.Tensor,
    weights: Mapping[str, torch.Tensor],
    state: KdaState,
    spec: ModelSpec,
    num: Numerics,
) -> tuple[torch.Tensor, KdaState]:
    """One decode step of one TP rank. x_hat [R, D] -> (this rank's o_proj partial sum [R, D], new state).

    `weights` has the keys of `Shards.weight_shapes()["kda"]` at this rank's shapes; H_local comes from A_log.
    """
    R = x_hat.shape[0]
    K = spec.kda.head_dim
    H = weights["A_log"].shape[0]
    P = H * K
    u, b, f, og = _project(num.c(x_hat), weights)
    y, conv = short_conv_step(u, state.conv, _conv_weight(weights, num), num)  # [R, 3P]
    qt, kt, vt = (t.reshape(R, H, K) for t in y.split(P, dim=-1))
    g = safe_gate(f.reshape(R, H, K), weights["A_log"], weights["dt_bias"], spec.kda.gate_lower_bound)
    beta = torch.sigmoid(b)  # [R, H]
    # scale after the norm (SPEC §11 trap 6)
    q = l2norm(qt) * K**-0.5
    k = l2norm(kt)
    o, S = delta_rule_step(q, k, vt, g, beta, num.c(state.recurrent))
    z = gated_rmsnorm(o, og.reshape(R, H, K), num.c(weights["o_norm.weight"]), spec.model.rms_norm_eps)
    # z reaches o_proj as the kernel stores it (bf16)
    out = linear(num.store(z).reshape(R, P), weights["o_proj.weight"])
    return out, KdaState(conv=conv, recurrent=S)


def kda_attention_prefill(
    x_hat_seq: torch.Tensor,
    weights: Mapping[str, torch.Tensor],
    spec: ModelSpec,
    num: Numerics,
) -> tuple[torch.Tensor, KdaState]:
    """One row over T tokens from a zero state, written in sequence form independently of
    `kda_attention`. x_hat_seq [T, D] -> (out_seq [T, D], final KdaState with R = 1).

    Rounding matches decode: decode reads past tokens' u back from the bf16 conv state but uses the
    current token's u as computed. So the conv runs over num.store(u) and the current tap adds back
    w[W-1] * (u - num.store(u)). With FP64 (store_dtype None) that correction is exactly zero.
    """
    T = x_hat_seq.shape[0]
    K = spec.kda.head_dim
    H = weights["A_log"].shape[0]
    P = H * K
    u, b, f, og = _project(num.c(x_hat_seq), weights)  # [T, 3P], [T, H], [T, P], [T, P]
    w = _conv_weight(weights, num)  # [3P, 1, W]
    C, W = u.shape[1], w.shape[-1]
    u_st = num.store(u)
    # full causal depthwise conv: output t sees inputs t-W+1 .. t, tap W-1 on input t
    acc = F.conv1d(u_st.t()[None], w, padding=W - 1, groups=C)[0, :, :T].t()  # [T, 3P]
    y = F.silu(acc + (u - u_st) * w[:, 0, W - 1])
    qt, kt, vt = (t.reshape(T, H, K) for t in y.split(P, dim=-1))
    g = safe_gate(f.reshape(T, H, K), weights["A_log"], weights["dt_bias"], spec.kda.gate_lower_bound)
    beta = torch.sigmoid(b)  # [T, H]
    q = l2norm(qt) * K**-0.5
    k = l2norm(kt)

    # S_t = (I - beta k k^T) diag(exp g) S_{t-1} + beta k v^T ; o_t = S_t^T q_t
    eye = torch.eye(K, dtype=num.dtype)
    S = torch.zeros(H, K, K, dtype=num.dtype)  # [H, K, V]
    o = []
    for t in range(T):
        kb = k[t] * beta[t, :, None]  # [H, K]
        A = (eye - kb[:, :, None] * k[t][:, None, :]) * g[t].exp()[:, None, :]  # [H, K, K]
        S = A @ S + kb[:, :, None] * vt[t][:, None, :]
        o.append((q[t][:, None, :] @ S)[:, 0])  # [H, V]
    o = torch.stack(o)  # [T, H, V]

    z = gated_rmsnorm(o, og.reshape(T, H, K), num.c(weights["o_norm.weight"]), spec.model.rms_norm_eps)
    out = linear(num.store(z).reshape(T, P), weights["o_proj.weight"])
    # last W-1 raw inputs, zero-padded in front when T < W-1
    conv = torch.cat([u_st.new_zeros(W - 1, C), u_st])[-(W - 1) :]
    return out, KdaState(conv=conv[None], recurrent=S[None])
