"""A layer's weights as the layer kernel reads them, one rank's, laid out once per key (like a checkpoint's fused
layout): the gates', then the attention half's (KDA or MLA), then the FFN half's (the dense MLP or the MoE)."""

from __future__ import annotations

import torch

from glm53ctl.kernels.ops.dsa.kernel import a_weight
from glm53ctl.kernels.ops.ffn.moe import stack_experts
from glm53ctl.kernels.ops.gemv.kernel import fold_norm


def prepare_weights(
    w, spec, tp: int, device, fold: bool = False, ffn: str = "dense", attn: str = "kda"
) -> dict[str, torch.Tensor]:
    """One rank's layer weights as the kernel reads them (done once per key, like a checkpoint's fused
    layout): the in-projection rows f_a | g_a | b | (q_h | k_h | v_h per head), the conv taps [3P, W] fp32.
    fold (`gemv.folds` of knob `norm` and the rows): the in-projection, gate and up times their gate's norm
    weight, rounded to bf16 once. ffn "moe": the router and the experts stacked by id, the shared expert after
    them (expert E), instead of the dense MLP (gate and up not folded: the router and every expert read x̂).
    attn "mla": `sparse`'s attention half instead of KDA's (`_mla_weights`)."""
    a_ = "self_attn."
    out = {
        "fn_a": w["hc_attn_fn"].float(),
        "base_a": w["hc_attn_base"].float(),
        "scale_a": w["hc_attn_scale"].float(),
        "norm_a": w["input_layernorm.weight"],
        "fn_f": w["hc_ffn_fn"].float(),
        "base_f": w["hc_ffn_base"].float(),
        "scale_f": w["hc_ffn_scale"].float(),
        "norm_f": w["post_attention_layernorm.weight"],
    }
    if attn == "mla":
        out |= _mla_weights(w.sub(a_), spec, tp)
    else:
        heads, K, D = spec.shards(tp).kda_heads, spec.kda.head_dim, spec.hidden
        qkv = torch.stack([w[f"{a_}{n}_proj.weight"].view(heads, K, D) for n in ("q", "k", "v")], dim=1)
        w_in = torch.cat([w[f"{a_}{n}.weight"] for n in ("f_a_proj", "g_a_proj", "b_proj")] + [qkv.reshape(-1, D)])
        out |= _kda_weights(w, a_, w_in, fold)
    out |= _ffn_weights(w, spec, ffn, fold)
    return {k: v.to(device).contiguous() for k, v in out.items()}


def _kda_weights(w, a_: str, w_in, fold: bool) -> dict[str, torch.Tensor]:
    """KDA's attention weights as the kernel reads them."""
    return {
        "w_in": fold_norm(w["input_layernorm.weight"], w_in) if fold else w_in.to(torch.bfloat16),
        "w_fb": w[f"{a_}f_b_proj.weight"],
        "w_gb": w[f"{a_}g_b_proj.weight"],
        "conv_w": torch.cat([w[f"{a_}{n}_conv1d.weight"][:, 0] for n in ("q", "k", "v")]).float(),
        "A_log": w[f"{a_}A_log"].float(),
        "dt_bias": w[f"{a_}dt_bias"].float(),
        "o_norm": w[f"{a_}o_norm.weight"],
        "w_o": w[f"{a_}o_proj.weight"],
    }


def _mla_weights(a, spec, tp: int) -> dict[str, torch.Tensor]:
    """`sparse`'s attention weights as the kernel reads them: the fused A projection (q_a | kv_a | the indexer's
    wk | its pool gate | its head weights), q_b | the indexer's wq_b, and per head W_UKᵀ [HQ, C, NOPE] and W_UV
    [HQ, V, C] from kv_b."""

    m = spec.mla
    kv_b = a["kv_b_proj.weight"].view(spec.shards(tp).mla_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    bf = torch.bfloat16
    return {
        "w_a": a_weight(a),
        "q_norm": a["q_a_layernorm.weight"].to(bf),
        "kv_norm": a["kv_a_layernorm.weight"].to(bf),
        "k_w": a["indexer.k_norm.weight"].to(bf),
        "k_b": a["indexer.k_norm.bias"].to(bf),
        "ape": a["indexer.index_kpool_compress_ape"].float(),
        "w_qb": torch.cat([a["q_b_proj.weight"], a["indexer.wq_b.weight"]]).to(bf),
        "w_ukt": kv_b[:, : m.qk_nope_head_dim].transpose(1, 2).to(bf),
        "w_uv": kv_b[:, m.qk_nope_head_dim :].to(bf),
        "w_o": a["o_proj.weight"].to(bf),
    }


def _ffn_weights(w, spec, ffn: str, fold: bool) -> dict[str, torch.Tensor]:
    norm_f = w["post_attention_layernorm.weight"]
    out = {}
    if ffn == "moe":
        m = w.sub("mlp.")
        w_eg, w_eu, w_ed = stack_experts(m, spec.moe.experts, shared=True)
        out |= {"w_r": m["gate.weight"].to(torch.bfloat16), "r_bias": m["gate.e_score_correction_bias"].float()}
        out |= {"w_eg": w_eg, "w_eu": w_eu, "w_ed": w_ed}
    else:
        out["w_gate"] = fold_norm(norm_f, w["mlp.gate_proj.weight"]) if fold else w["mlp.gate_proj.weight"]
        out["w_up"] = fold_norm(norm_f, w["mlp.up_proj.weight"]) if fold else w["mlp.up_proj.weight"]
        out["w_down"] = w["mlp.down_proj.weight"]
    return out
