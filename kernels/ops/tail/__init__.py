from glm53ctl.kernels.ops.tail.naive import final_norm, logits_shard
from glm53ctl.kernels.ops.tail.tasks import (
    TAIL_GATHER,
    TAIL_LM_HEAD,
    TAIL_NORM,
    TailGather,
    TailLmHead,
    TailNorm,
    tail_gather_fields,
    tail_lm_head_fields,
    tail_norm_fields,
)

__all__ = [
    "final_norm",
    "logits_shard",
    "TAIL_GATHER",
    "tail_gather_fields",
    "TAIL_LM_HEAD",
    "tail_lm_head_fields",
    "TAIL_NORM",
    "tail_norm_fields",
    "TailGather",
    "TailLmHead",
    "TailNorm",
]
