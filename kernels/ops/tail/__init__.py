from glm53ctl.kernels.ops.tail import tasks
from glm53ctl.kernels.ops.tail.naive import final_norm, logits_shard

__all__ = ["final_norm", "logits_shard", "tasks"]
