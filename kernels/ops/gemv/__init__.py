from glm53ctl.kernels.ops.gemv import tasks
from glm53ctl.kernels.ops.gemv.naive import gemv_reference

__all__ = ["gemv_reference", "tasks"]
