"""`sparse`'s stock-PyTorch baseline (the `torch` and `compile` baselines of `bench`): rank 0's share of a DSA layer
as a serving stack without fused kernels runs it, in ops a CUDA graph can capture. The reference's math
(kernels/ops/dsa/naive.py), with what it does on the host done on the device: the cache writes by index, the
completed pool's key written where a row completes one, and the selection as a stable sort of every row's pools
(past a row's complete pools: -inf, last) and a sort of the chosen tokens with the tail. The index scores in
fp32, as serving stacks compute them."""

from __future__ import annotations

import torch

from glm53ctl.kernels.numerics import Numerics, linear
from glm53ctl.kernels.ops.dsa.naive import (
    _kv_b,
    index_scores,
    indexer_key,
    indexer_query,
    mla_projections,
    mla_scale,
    pool_key,
    sparse_mla,
)
from glm53ctl.kernels.state import DsaCache


def select_on_device(scores: torch.Tensor, n: torch.Tensor, spec) -> torch.Tensor:
    """Every row's tokens [R, index_width] (-1 padded) from its pools' scores [R, pools] and n [R] cached tokens,
    as `select_token_rows`, with no host round trip."""
    kp, dev = spec.indexer.kpool, scores.device
    P = n // kp
    pools = torch.arange(scores.shape[1], device=dev)
    s = torch.where(pools[None, :] < P[:, None], scores, float("-inf"))
    top = torch.sort(s, dim=-1, descending=True, stable=True).indices[:, : spec.index_pools]  # [R, TOPP]
    big = torch.iinfo(torch.long).max
    j = torch.arange(kp, device=dev)
    chosen = torch.where((top < P[:, None])[..., None], top[..., None] * kp + j, big).flatten(1)
    tail = P[:, None] * kp + j
    tail = torch.where(tail < n[:, None], tail, big)
    tokens = torch.sort(torch.cat([chosen, tail], dim=1), dim=-1).values[:, : spec.index_width]
    return torch.where(tokens == big, -1, tokens)


def stock_dsa(x_hat, w, cache: DsaCache, pos: torch.Tensor, spec, num: Numerics) -> torch.Tensor:
    """This rank's o_proj partial [R, D] of one step (the caches' writes happen, out of place, and are dropped:
    the launch's timing counts them, the baseline's math needs them)."""
    kp = spec.indexer.kpool
    R = x_hat.shape[0]
    rows = torch.arange(R, device=pos.device)
    qr, q, c = mla_projections(x_hat, w, spec, num)
    qi, wi = indexer_query(qr, x_hat, w, spec, num)
    ki, gi = indexer_key(x_hat, w, spec, num)
    W_UK, W_UV = _kv_b(w, spec, num)
    st = lambda t, v: t.index_put((rows, pos), num.store(v).to(t.dtype))  # noqa: E731
    latent, index_key, index_gate = st(cache.latent, c), st(cache.index_key, ki), st(cache.index_gate, gi)
    n = pos + 1
    p = (n // kp - 1).clamp(min=0)
    tok = p[:, None] * kp + torch.arange(kp, device=pos.device)
    ape = num.c(w["indexer.index_kpool_compress_ape"])
    pk = pool_key(num.c(index_key[rows[:, None], tok]), num.c(index_gate[rows[:, None], tok]), ape)
    old = cache.pooled_key[rows, p]
    new = torch.where((n % kp == 0)[:, None], num.store(pk).to(old.dtype), old)
    pooled = cache.pooled_key.index_put((rows, p), new)
    scores = index_scores(qi.float(), wi.float(), pooled.float(), spec)  # [R, pools]
    idx = select_on_device(scores, n, spec)
    q_lat = torch.einsum("rhd,hdc->rhc", q, W_UK)
    o_lat = num.store(sparse_mla(q_lat, num.c(latent), idx, mla_scale(spec)))
    o = num.store(torch.einsum("rhc,hvc->rhv", o_lat, W_UV).flatten(1))
    return linear(o, w["o_proj.weight"])
