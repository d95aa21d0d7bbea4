from glm53ctl.kernels.embed.naive import check_tokens, embed_partial, streams

__all__ = ["check_tokens", "embed_partial", "streams"]
