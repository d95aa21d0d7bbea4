from glm53ctl.kernels.ops.embed import tasks
from glm53ctl.kernels.ops.embed.naive import check_tokens, embed_partial, streams

__all__ = ["check_tokens", "embed_partial", "streams", "tasks"]
