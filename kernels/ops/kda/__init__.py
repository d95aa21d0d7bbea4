"""KDA (Kimi Delta Attention) layer, attention part (docs/model.md §4)."""

from glm53ctl.kernels.ops.kda import tasks
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

__all__ = [
    "delta_rule_step",
    "gated_rmsnorm",
    "kda_attention",
    "kda_attention_prefill",
    "kda_task",
    "kda_write_back",
    "l2norm",
    "safe_gate",
    "short_conv_step",
    "tasks",
]
