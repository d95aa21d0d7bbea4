"""The FFNs, exact: clamped-SwiGLU MLP (dense, routed and shared experts) and the router (docs/model.md §6)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from glm53ctl.kernels.numerics import Numerics, linear


def swiglu_mlp(x_hat, w_gate, w_up, w_down, limit: float, num: Numerics) -> torch.Tensor:
    """down(silu(min(gate, limit)) * clamp(up, -limit, limit)): this rank's partial [R, D].

    The activation is what a kernel hands to the down projection in bf16, so it is rounded there.
    """
    x = num.c(x_hat)
    g = linear(x, w_gate).clamp(max=limit)
    u = linear(x, w_up).clamp(-limit, limit)
    return linear(num.store(F.silu(g) * u), w_down)


def topk_ordered(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest along the last dim; ties by index ascending (the project's rule everywhere)."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :k]


# A launch's choice the reference takes where its own scores tie it: the launch's experts, every one scoring within
# this of the reference's top_k-th (the router's scores carry the bf16 hand-offs' error, about 1e-3, before it)
ROUTE_TIE = 5e-3


def near_tie(scores: torch.Tensor, own: torch.Tensor, theirs: torch.Tensor, tol: torch.Tensor) -> torch.Tensor:
    """Per row: whether `theirs` (ids [R, k]) is as good a top-k of `scores` [R, N] as `own` within `tol` [R]:
    distinct, in range, and every id it took instead of one of own's scoring within tol of every one it left."""
    N = scores.shape[-1]
    ok = (theirs >= 0).all(-1) & (theirs < N).all(-1)
    if theirs.shape[-1] > 1:
        ok &= theirs.sort(-1).values.diff(dim=-1).ne(0).all(-1)
    mine = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, own, True)
    took = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, theirs.clamp(0, N - 1), True)
    left = scores.masked_fill(~(mine & ~took), float("-inf")).max(-1).values  # own's ids they left out
    added = scores.masked_fill(~(took & ~mine), float("inf")).min(-1).values  # the ids they took instead
    return ok & (added >= left - tol)


def route(x_hat, w_router, bias, spec, num: Numerics, follow: torch.Tensor | None = None, tie: float = 1.0):
    """Sigmoid router, noaux_tc: experts chosen by s + bias, weighted by s alone (trap 9). `follow`: a launch's
    ids [R, top_k], taken for the rows where they tie the reference's choice (ROUTE_TIE times `tie`; infinite:
    wherever they are k distinct experts in range).

    Returns ids [R, top_k] (ascending) and weights [R, top_k] that sum to routed_scaling_factor.
    """
    moe = spec.moe
    # fp32 at least: the router is fp32 in the checkpoint's config (moe_router_dtype)
    dtype = torch.promote_types(num.dtype, torch.float32)
    s = torch.sigmoid(x_hat.to(dtype) @ w_router.to(dtype).t())  # [R, E]
    s_b = s + bias.to(dtype)
    if moe.n_group > 1:
        R, E = s_b.shape
        grouped = s_b.view(R, moe.n_group, E // moe.n_group)
        group_score = grouped.topk(2, dim=-1).values.sum(-1)
        keep = topk_ordered(group_score, moe.topk_group)
        mask = torch.ones_like(group_score, dtype=torch.bool).scatter_(1, keep, False)
        s_b = grouped.masked_fill(mask[..., None], float("-inf")).view(R, E)
    ids = topk_ordered(s_b, moe.top_k).sort(dim=-1).values
    if follow is not None:
        theirs = follow.to(ids.device, torch.long).sort(dim=-1).values
        tol = torch.full(ids.shape[:1], ROUTE_TIE * tie, dtype=s_b.dtype, device=ids.device)
        ids = torch.where(near_tie(s_b, ids, theirs, tol)[:, None], theirs, ids)
    chosen = s.gather(1, ids)
    weights = chosen / (chosen.sum(-1, keepdim=True) + 1e-20) * moe.routed_scaling_factor
    return ids, num.c(weights)


def moe(x_hat, weights: Mapping[str, torch.Tensor], spec, num: Numerics, follow: torch.Tensor | None = None, tie=1.0):
    """Routed experts (weighted) plus the shared expert (unscaled), accumulated in the compute dtype.

    `weights` holds this rank's shards: gate.*, experts.{e}.{gate,up,down}_proj.weight,
    shared_experts.*. Returns (partial [R, D], ids, routing weights).
    """
    lim = spec.moe.swiglu_limit
    ids, w = route(
        num.c(x_hat), weights["gate.weight"], weights["gate.e_score_correction_bias"], spec, num, follow, tie
    )
    out = swiglu_mlp(
        x_hat,
        weights["shared_experts.gate_proj.weight"],
        weights["shared_experts.up_proj.weight"],
        weights["shared_experts.down_proj.weight"],
        lim,
        num,
    )
    for r in range(x_hat.shape[0]):
        for slot in range(ids.shape[1]):
            e = int(ids[r, slot])
            y = swiglu_mlp(
                x_hat[r : r + 1],
                weights[f"experts.{e}.gate_proj.weight"],
                weights[f"experts.{e}.up_proj.weight"],
                weights[f"experts.{e}.down_proj.weight"],
                lim,
                num,
            )
            out[r] += w[r, slot] * y[0]
    return out, ids, w
