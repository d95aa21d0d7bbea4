from glm53ctl.kernels.ops.ffn import tasks
from glm53ctl.kernels.ops.ffn.layer_mlp import mlp_task
from glm53ctl.kernels.ops.ffn.layer_moe import moe_task
from glm53ctl.kernels.ops.ffn.moe import moe_launch
from glm53ctl.kernels.ops.ffn.naive import moe, route, swiglu_mlp, topk_ordered

__all__ = ["mlp_task", "moe", "moe_launch", "moe_task", "route", "swiglu_mlp", "tasks", "topk_ordered"]
