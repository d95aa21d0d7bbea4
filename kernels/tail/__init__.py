from glm53ctl.kernels.tail.naive import final_norm, logits_shard

__all__ = ["final_norm", "logits_shard"]
