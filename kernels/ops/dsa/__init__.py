"""One DSA layer's attention part (docs/model.md §5): MLA projections, k-pool indexer + top-k, absorbed sparse MLA."""

from glm53ctl.kernels.ops.dsa import tasks
from glm53ctl.kernels.ops.dsa.kernel import dsa_launch
from glm53ctl.kernels.ops.dsa.layer import mla_task
from glm53ctl.kernels.ops.dsa.naive import (
    DsaOut,
    dsa_attention,
    dsa_attention_prefill,
    index_scores,
    indexer_key,
    indexer_query,
    mla_projections,
    mla_scale,
    pool_key,
    select_token_rows,
    select_tokens,
    sparse_mla,
)
from glm53ctl.kernels.ops.dsa.select import SelectDims, select_dims, select_launch, select_pass, select_take

__all__ = [
    "dsa_attention",
    "dsa_attention_prefill",
    "dsa_launch",
    "DsaOut",
    "index_scores",
    "indexer_key",
    "indexer_query",
    "mla_projections",
    "mla_scale",
    "mla_task",
    "pool_key",
    "select_dims",
    "select_launch",
    "select_pass",
    "select_take",
    "select_token_rows",
    "select_tokens",
    "SelectDims",
    "sparse_mla",
    "tasks",
]
