"""The layer kernel: one decode layer (an attention half, then an FFN half, each between an mHC gate and an
all-reduce with hc_post) as one persistent launch. The layer kinds combine its halves (the registry's `layer`):
`dense` KDA with the dense MLP, `kda` KDA with the MoE, `sparse` MLA with the MoE; their folders keep only their
facts and harnesses.

Files: `table.py` (shapes, tiles and the task table), `kernel.py` (the claim loop and dispatch), `shared.py` (the
tasks every layer has: the gates, o_proj, the all-reduces), the halves' tasks `kda.py`, `mla.py` (attention),
`mlp.py`, `moe.py` (FFN), `prefetch.py`, `args.py` (the kernel's arguments by concern), `weights.py` (the weights
as the kernel reads them), `launch.py` (buffers, arguments, one launch).
"""
