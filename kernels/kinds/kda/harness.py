"""One key of `kda` with its peers: `dense`'s harness with the MoE as its FFN half (kinds/kda/__init__.py)."""

from __future__ import annotations

from dataclasses import replace

import torch

from glm53ctl.kernels.kinds.dense.harness import DenseHarness
from glm53ctl.kernels.kinds.harness import nbytes
from glm53ctl.kernels.kinds.layer.table import MOE_STAGES, down_stages, route_stages
from glm53ctl.kernels.ops.ffn.moe import stack_experts
from glm53ctl.kernels.ops.ffn.naive import route, swiglu_mlp


class KdaHarness(DenseHarness):
    kind = "kda"
    FFN = "moe"
    STAGES = MOE_STAGES
    FOLLOWED = ("moe.ids",)  # the routing, where the router's scores tie

    @classmethod
    def stages(cls, knobs) -> tuple:
        return down_stages(route_stages(cls.STAGES, knobs), knobs)

    def invariants(self, out: dict, ref: dict) -> dict[str, bool]:
        """The routing as check asks for it: the reference's experts, distinct and in range per row, weights
        summing to the scale, and the shared expert always on (its slot's rows written)."""
        spec, R = self.spec, self.rows
        ids, w = out["moe.ids"].long().cpu(), out["moe.weights"].float().cpu()
        launch = self.launch
        shared = launch.buf["y_m"][launch.nslot, :R]
        return {
            "routing equals the reference's (near-ties followed)": torch.equal(ids, ref["moe.ids"].long().cpu()),
            "experts distinct and in range": all(len(set(r.tolist())) == spec.moe.top_k for r in ids)
            and 0 <= int(ids.min())
            and int(ids.max()) < spec.moe.experts,
            "routing weights sum to the scale": torch.allclose(
                w.sum(-1), torch.full((R,), spec.moe.routed_scaling_factor), rtol=1e-5, atol=0
            ),
            "shared expert on": bool(torch.isfinite(shared).all()),
        }

    def timed(self, x, peers):
        """dense's, with the bytes of the experts the rows chose only: one launch first, for its routing (an
        expert nobody chose is not read; each chosen one once for all the rows that chose it)."""
        t = super().timed(x, peers)
        self(x, peers)
        untouched = self.spec.moe.experts - int(self.launch.buf["n_slots"][0])
        w = self.w[0]
        per_expert = sum(nbytes(w[n]) for n in ("w_eg", "w_eu", "w_ed")) // (self.spec.moe.experts + 1)  # + shared
        skip = untouched * per_expert
        return replace(t, stream_bytes=t.stream_bytes - skip, nbytes=t.nbytes - skip)

    def stock_weights(self) -> dict[str, torch.Tensor]:
        """dense's, with the experts stacked by id (`mlp.experts.{gate,up,down}`) instead of one tensor each."""

        w = super().stock_weights()
        E = self.spec.moe.experts
        stacked = stack_experts({n.removeprefix("mlp."): t for n, t in w.items() if n.startswith("mlp.")}, E)
        w = {n: t for n, t in w.items() if not n.startswith("mlp.experts.")}
        return w | {f"mlp.experts.{p}": t for p, t in zip(("gate", "up", "down"), stacked, strict=True)}

    def stock_ffn(self, xh, w: dict, num):
        """The FFN half of `stock`: the MoE as a serving stack without fused kernels runs it, in stock ops that a
        CUDA graph can capture (no host round trip): the reference's router, each row's chosen experts gathered
        from the stacked weights, their clamped SwiGLU, the weighted sum, the shared expert."""

        spec, lim = self.spec, self.spec.moe.swiglu_limit
        x = num.c(xh)
        ids, wts = route(x, w["mlp.gate.weight"], w["mlp.gate.e_score_correction_bias"], spec, num)
        g = torch.einsum("rd,rkid->rki", x, w["mlp.experts.gate"][ids].to(x.dtype)).clamp(max=lim)
        u = torch.einsum("rd,rkid->rki", x, w["mlp.experts.up"][ids].to(x.dtype)).clamp(-lim, lim)
        act = num.store(torch.nn.functional.silu(g) * u)
        y = torch.einsum("rki,rkdi->rkd", act, w["mlp.experts.down"][ids].to(x.dtype))
        sh = "mlp.shared_experts."
        shared = swiglu_mlp(
            xh, w[sh + "gate_proj.weight"], w[sh + "up_proj.weight"], w[sh + "down_proj.weight"], lim, num
        )
        return shared + (wts[..., None] * y).sum(1)
