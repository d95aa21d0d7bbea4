from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, LaunchFault, Runtime
from glm53ctl.kernels.runtime.table import BOX, FLAG, TaskTable

__all__ = ["BOX", "DEFAULT_BUDGET_NS", "FLAG", "LaunchFault", "Runtime", "TaskTable"]
