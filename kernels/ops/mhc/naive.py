"""mHC (manifold-constrained hyper-connections) and the RMSNorm gates, exact (docs/model.md §3)."""

from __future__ import annotations

import torch

from glm53ctl.kernels.numerics import Numerics, rms_norm


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Row-softmax, then column normalisation, then iters-1 (row, column) rounds. [..., 4, 4] -> C[i, j]."""
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)  # trap 10: the loop starts with a column normalisation
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def hc_pre(H, fn, base, scale, *, streams: int, iters: int, hc_eps: float, norm_eps: float, num: Numerics):
    """Collapse the streams: H [R, hc, D] -> x [R, D], post [R, hc], comb [R, hc, hc] (C[i, j])."""
    H = num.c(H)
    R, hc, D = H.shape
    f = rms_norm(H.reshape(R, hc * D), None, norm_eps)  # unweighted RMSNorm over all streams
    mix = f @ num.c(fn).t()  # [R, (2 + hc) * hc]
    base, scale = num.c(base), num.c(scale)
    pre = torch.sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + hc_eps
    post = 2 * torch.sigmoid(mix[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])  # (0, 2)
    logits = mix[:, 2 * hc :].reshape(R, hc, hc) * scale[2] + base[2 * hc :].reshape(hc, hc)
    comb = sinkhorn(logits, iters, hc_eps)
    x = torch.einsum("rj,rjd->rd", pre, H)
    return x, post, comb


def hc_post(a, H, post, comb, num: Numerics) -> torch.Tensor:
    """Expand back: H_new[j] = post[j] * a + sum_i C[i, j] * H[i] (trap 10: C transposed). Stored bf16."""
    a, H = num.c(a), num.c(H)
    H_new = post[:, :, None] * a[:, None, :] + torch.einsum("rij,rid->rjd", comb, H)
    return num.store(H_new)


def gate(H, fn, base, scale, norm_weight, spec, num: Numerics):
    """hc_pre then the RMSNorm gate: publishes x̂ [R, D] (stored bf16), post [R, hc] and comb [R, hc, hc]."""
    x, post, comb = hc_pre(
        H,
        fn,
        base,
        scale,
        streams=spec.mhc.streams,
        iters=spec.mhc.sinkhorn_iters,
        hc_eps=spec.mhc.eps,
        norm_eps=spec.model.rms_norm_eps,
        num=num,
    )
    x_hat = num.store(rms_norm(x, num.c(norm_weight), spec.model.rms_norm_eps))
    return x_hat, post, comb
