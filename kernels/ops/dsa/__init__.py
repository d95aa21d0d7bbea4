"""One DSA layer's attention part (docs/model.md §5): MLA projections, k-pool indexer + top-k, absorbed sparse MLA."""

from glm53ctl.kernels.ops.dsa import tasks
from glm53ctl.kernels.ops.dsa.kernel import dsa_launch
from glm53ctl.kernels.ops.dsa.layer import mla_task
from glm53ctl.kernels.ops.dsa.naive import DsaOut, dsa_attention, dsa_attention_prefill, select_token_rows
from glm53ctl.kernels.ops.dsa.select import SelectDims, select_dims, select_launch, select_pass, select_take

__all__ = [
    "dsa_attention",
    "dsa_attention_prefill",
    "dsa_launch",
    "DsaOut",
    "mla_task",
    "select_dims",
    "select_launch",
    "select_pass",
    "select_take",
    "select_token_rows",
    "SelectDims",
    "tasks",
]
