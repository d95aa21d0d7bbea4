"""A layer from the Triton task bodies as separate plain launches (TP1): the composition the persistent
layer launches fuse, checked against the reference, and the separate-launches baseline of issue 7."""

from __future__ import annotations

import torch

from glm53ctl.kernels.ffn.kernel import swiglu
from glm53ctl.kernels.gemv import gemv
from glm53ctl.kernels.kda.kernel import kda_core
from glm53ctl.kernels.mhc.kernel import gate, hc_post
from glm53ctl.kernels.state import KdaState


def dense_layer(H: torch.Tensor, w, state: KdaState, spec) -> tuple[dict[str, torch.Tensor], KdaState]:
    """Layers 0-2 (KDA + dense MLP) at TP1: H [R, hc, D] bf16 -> every output and the new KDA state.

    `w` maps the layer's checkpoint suffixes to tensors (Weights.layer(i)); the in-projections are one GEMV
    over the concatenated q|k|v|b|f_a|g_a rows, as in the fused checkpoint layout."""
    a_ = "self_attn."
    P, H_heads, r = spec.kda_proj, spec.kda.heads, spec.kda.gate_rank
    x_hat, post, comb = gate(
        H, w["hc_attn_fn"], w["hc_attn_base"], w["hc_attn_scale"], w["input_layernorm.weight"], spec
    )
    w_in = torch.cat([w[f"{a_}{n}.weight"] for n in ("q_proj", "k_proj", "v_proj", "b_proj", "f_a_proj", "g_a_proj")])
    y = gemv(x_hat, w_in)
    u, b, f_lr, g_lr = y.split([3 * P, H_heads, r, r], dim=1)
    # the low-rank intermediates are handed on in bf16
    f = gemv(f_lr.to(torch.bfloat16), w[f"{a_}f_b_proj.weight"])
    og = gemv(g_lr.to(torch.bfloat16), w[f"{a_}g_b_proj.weight"])
    conv_w = torch.cat([w[f"{a_}{n}_conv1d.weight"][:, 0] for n in ("q", "k", "v")])
    z, conv, S = kda_core(
        u,
        b,
        f,
        og,
        state.conv,
        state.recurrent,
        conv_w,
        w[f"{a_}A_log"],
        w[f"{a_}dt_bias"],
        w[f"{a_}o_norm.weight"],
        spec,
    )
    attn = gemv(z, w[f"{a_}o_proj.weight"])
    H1 = hc_post(attn, H, post, comb)
    x_f, post_f, comb_f = gate(
        H1, w["hc_ffn_fn"], w["hc_ffn_base"], w["hc_ffn_scale"], w["post_attention_layernorm.weight"], spec
    )
    gu = gemv(x_f, torch.cat([w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]]))
    m = gemv(swiglu(gu, spec.moe.swiglu_limit), w["mlp.down_proj.weight"])
    H2 = hc_post(m, H1, post_f, comb_f)
    out = {
        "attn.x_hat": x_hat,
        "attn.post": post,
        "attn.comb": comb,
        "attn.out": attn,
        "attn.H": H1,
        "ffn.x_hat": x_f,
        "ffn.post": post_f,
        "ffn.comb": comb_f,
        "ffn.out": m,
        "H": H2,
    }
    return out, KdaState(conv, S)
