from glm53ctl.kernels.ops.gemv.naive import gemv_reference
from glm53ctl.kernels.ops.gemv.tasks import OPROJ, OProj, oproj_fields

__all__ = ["gemv_reference", "OPROJ", "OProj", "oproj_fields"]
