from glm53ctl.kernels.ops.mhc import tasks
from glm53ctl.kernels.ops.mhc.naive import gate, hc_post, hc_pre, sinkhorn

__all__ = ["gate", "hc_post", "hc_pre", "sinkhorn", "tasks"]
