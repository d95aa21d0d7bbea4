from glm53ctl.kernels.ops.embed.naive import check_tokens, embed_partial, streams
from glm53ctl.kernels.ops.embed.tasks import EMBED_GATHER, EMBED_REDUCE, EmbedGather, EmbedReduce, embed_fields

__all__ = [
    "check_tokens",
    "embed_fields",
    "EMBED_GATHER",
    "embed_partial",
    "EMBED_REDUCE",
    "EmbedGather",
    "EmbedReduce",
    "streams",
]
