from glm53ctl.kernels.ops.ffn.naive import moe, route, swiglu_mlp, topk_ordered

__all__ = ["moe", "route", "swiglu_mlp", "topk_ordered"]
