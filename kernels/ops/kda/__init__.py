"""KDA (Kimi Delta Attention) layer, attention part (docs/model.md §4)."""

from glm53ctl.kernels.ops.kda.layer import kda_task, kda_write_back
from glm53ctl.kernels.ops.kda.naive import (
    delta_rule_step,
    gated_rmsnorm,
    kda_attention,
    kda_attention_prefill,
    l2norm,
    safe_gate,
    short_conv_step,
)
from glm53ctl.kernels.ops.kda.tasks import INPROJ, KDA_HEAD, InProj, KdaHead, inproj_fields, kda_head_fields

__all__ = [
    "delta_rule_step",
    "gated_rmsnorm",
    "INPROJ",
    "InProj",
    "inproj_fields",
    "kda_attention",
    "kda_attention_prefill",
    "KDA_HEAD",
    "kda_head_fields",
    "kda_task",
    "kda_write_back",
    "KdaHead",
    "l2norm",
    "safe_gate",
    "short_conv_step",
]
