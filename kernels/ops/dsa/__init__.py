"""One DSA layer's attention part (docs/model.md §5): MLA projections, k-pool indexer + top-k, absorbed sparse MLA."""

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

__all__ = [
    "DsaOut",
    "dsa_attention",
    "dsa_attention_prefill",
    "index_scores",
    "indexer_key",
    "indexer_query",
    "mla_projections",
    "mla_scale",
    "pool_key",
    "select_token_rows",
    "select_tokens",
    "sparse_mla",
]
