"""PyTorch reference of one DSA layer's attention part (docs/model.md §5): MLA projections, the k-pool
lightning indexer with top-k pools plus the tail, absorbed sparse MLA, o_proj.

`dsa_attention` is the decode step the kernels compute. `dsa_attention_prefill` is an independent,
sequence-shaped and unabsorbed formulation of the same math that the tests diff it against.
Everything is functional: inputs are never written, updated caches come back as new tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from glm53ctl.kernels.numerics import Numerics, linear, rms_norm
from glm53ctl.kernels.ops.ffn.naive import near_tie
from glm53ctl.kernels.spec import ModelSpec
from glm53ctl.kernels.state import DsaCache

Weights = dict[str, torch.Tensor]


@dataclass(slots=True)
class DsaOut:
    out: torch.Tensor  # [R, D] this rank's o_proj partial; the caller all-reduces
    idx: torch.Tensor  # [R, index_width] int64 selected tokens, ascending, -1 padded
    cache: DsaCache  # the caches after this step's writes


def mla_scale(spec: ModelSpec) -> float:
    # trap 1: the head dim of q·k before absorption, not kv_lora_rank
    return (spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim) ** -0.5


def mla_projections(
    x_hat: torch.Tensor, weights: Weights, spec: ModelSpec, num: Numerics
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x̂ [R, D] -> qr [R, q_lora], q [R, H_local, nope], c [R, kv_lora] (docs/model.md §5.1). qr and q are
    handed between the launch's tasks in bf16 (num.store): the indexer's top-k is that sensitive to qr, a
    bf16 ulp moving pools across the threshold at a long context."""
    eps = spec.model.rms_norm_eps
    x = num.c(x_hat)
    qr = num.store(rms_norm(linear(x, weights["q_a_proj.weight"]), num.c(weights["q_a_layernorm.weight"]), eps))
    q = num.store(linear(qr, weights["q_b_proj.weight"])).unflatten(-1, (-1, spec.mla.qk_nope_head_dim))
    kv = linear(x, weights["kv_a_proj_with_mqa.weight"])
    c = rms_norm(kv, num.c(weights["kv_a_layernorm.weight"]), eps)
    return qr, q, c


def indexer_query(
    qr: torch.Tensor, x_hat: torch.Tensor, weights: Weights, spec: ModelSpec, num: Numerics
) -> tuple[torch.Tensor, torch.Tensor]:
    """qr [R, q_lora], x̂ [R, D] -> qi [R, Hi, ih], head weights w [R, Hi] (docs/model.md §5.2)."""
    ix = spec.indexer
    qi = linear(num.c(qr), weights["indexer.wq_b.weight"]).unflatten(-1, (ix.heads, ix.head_dim))
    w = linear(num.c(x_hat), weights["indexer.weights_proj.weight"]) * ix.heads**-0.5
    return qi, w


def indexer_key(
    x_hat: torch.Tensor, weights: Weights, spec: ModelSpec, num: Numerics
) -> tuple[torch.Tensor, torch.Tensor]:
    """x̂ [R, D] -> ki [R, ih] (LayerNorm with bias, trap 2), gi [R, ih] (k-pool gate logits)."""
    x = num.c(x_hat)
    k = linear(x, weights["indexer.wk.weight"])
    w, b = num.c(weights["indexer.k_norm.weight"]), num.c(weights["indexer.k_norm.bias"])
    ki = F.layer_norm(k, (k.shape[-1],), w, b, spec.indexer.norm_eps)
    gi = linear(x, weights["indexer.index_kpool_compress_gate.weight"])
    return ki, gi


def pool_key(keys: torch.Tensor, gates: torch.Tensor, ape: torch.Tensor) -> torch.Tensor:
    """keys, gates [..., kpool, ih], ape [kpool, ih] -> pooled key [..., ih]."""
    # trap 3: softmax over the kpool positions, separately for every channel
    pi = torch.softmax(gates + ape.to(gates.dtype), dim=-2)  # [..., kpool, ih]
    return (pi * keys).sum(-2)


def index_scores(qi: torch.Tensor, w: torch.Tensor, pooled: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """qi [R, Hi, ih], w [R, Hi], pooled [R, P, ih] -> I [R, P]."""
    # trap 4: ReLU per head before the head-weighted sum; w already carries Hi^-0.5
    s = torch.relu(qi @ pooled.transpose(-1, -2) * spec.indexer.head_dim**-0.5)  # [R, Hi, P]
    return (w[..., None] * s).sum(-2)


def select_tokens(scores: torch.Tensor, n: int, spec: ModelSpec) -> torch.Tensor:
    """scores [n // kpool] of the complete pools, n cached tokens -> token indices [index_width].

    Pools ranked by score descending, ties by pool index ascending; the first index_pools of them
    expanded to tokens in ascending order, then the tail kpool*P .. n-1, then -1 (trap 5).
    """
    kp = spec.indexer.kpool
    P = n // kp
    assert scores.shape == (P,), f"{tuple(scores.shape)} scores for {P} complete pools"
    dev = scores.device
    order = torch.sort(scores, descending=True, stable=True).indices  # stable: equal scores keep pool order
    pools = order[: spec.index_pools].sort().values
    tokens = (pools[:, None] * kp + torch.arange(kp, device=dev)).flatten()
    sel = torch.cat([tokens, torch.arange(P * kp, n, device=dev)])
    idx = torch.full((spec.index_width,), -1, dtype=torch.long, device=dev)
    idx[: sel.numel()] = sel
    return idx


def select_token_rows(scores: torch.Tensor, n: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """scores [R, >= max P] (pools past a row's P ignored), n [R] -> idx [R, index_width]."""
    kp = spec.indexer.kpool
    idx = torch.empty(len(n), spec.index_width, dtype=torch.long, device=scores.device)
    for r, m in enumerate(n.tolist()):
        idx[r] = select_tokens(scores[r, : m // kp], m, spec)
    return idx


# A launch's selection the reference takes where its own index scores tie it: every pool the launch took scoring
# within this share of the row's largest |score| of the reference's TOPP-th
SELECT_TIE = 1e-3


def follow_selection(
    scores: torch.Tensor, n: torch.Tensor, spec: ModelSpec, own, theirs, tie: float = 1.0
) -> torch.Tensor:
    """Per row, the launch's tokens `theirs` [R, W] where they take pools tying the reference's own choice `own`
    (SELECT_TIE times `tie`; infinite: wherever they are whole pools laid out as a selection), else the
    reference's."""

    kp, W = spec.indexer.kpool, spec.index_width
    theirs = theirs.to(own.device, torch.long)
    out = own.clone()
    n_tok, arange = spec.index_pools * kp, torch.arange(kp, device=own.device)
    for r, m in enumerate(n.tolist()):
        P = m // kp
        if P <= spec.index_pools or torch.equal(own[r], theirs[r]):
            continue  # every pool taken: nothing to tie
        s = scores[r : r + 1, :P]
        mine, took = own[r, :n_tok:kp][None] // kp, theirs[r, :n_tok:kp][None] // kp
        # theirs must be whole pools, ascending, each expanded to its tokens, then the same tail
        laid_out = torch.equal(theirs[r, :n_tok], (took[0, :, None] * kp + arange).flatten())
        laid_out &= bool((took[0, 1:] > took[0, :-1]).all()) and bool((took >= 0).all())
        tail_same = torch.equal(own[r, n_tok:], theirs[r, n_tok:W])
        # (an infinite tie takes any laid-out selection, also where every score is 0)
        tol = SELECT_TIE * tie * s.abs().max().reshape(1) if math.isfinite(tie) else torch.full_like(s[:, 0], math.inf)
        if laid_out and tail_same and bool(near_tie(s, mine, took, tol)[0]):
            out[r] = theirs[r]
    return out


def sparse_mla(q_lat: torch.Tensor, latent: torch.Tensor, idx: torch.Tensor, scale: float) -> torch.Tensor:
    """q_lat [R, H, kv_lora], latent [R, Lmax, kv_lora], idx [R, W] (-1 = none) -> o_lat [R, H, kv_lora]."""
    valid = idx >= 0  # [R, W]
    lat = torch.gather(latent, 1, idx.clamp(min=0)[..., None].expand(-1, -1, latent.shape[-1]))  # [R, W, kv]
    s = (q_lat @ lat.transpose(1, 2) * scale).masked_fill(~valid[:, None], float("-inf"))  # [R, H, W]
    return torch.softmax(s, -1) @ lat


def _kv_b(weights: Weights, spec: ModelSpec, num: Numerics) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UK [H_local, nope, kv_lora], W_UV [H_local, v, kv_lora]: each head's (nope+v) row block of kv_b."""
    m = spec.mla
    kv_b = num.c(weights["kv_b_proj.weight"]).unflatten(0, (-1, m.qk_nope_head_dim + m.v_head_dim))
    W_UK, W_UV = kv_b.split([m.qk_nope_head_dim, m.v_head_dim], dim=1)
    return W_UK, W_UV


def dsa_attention(
    x_hat: torch.Tensor,
    weights: Weights,
    cache: DsaCache,
    pos: torch.Tensor,
    spec: ModelSpec,
    num: Numerics,
    follow: torch.Tensor | None = None,
    tie: float = 1.0,
) -> DsaOut:
    """One decode step of rows at positions pos [R] (tokens cached before it); writes slot pos. `follow`: a
    launch's selection [R, W], taken for the rows where it ties the reference's (`follow_selection`)."""
    kp = spec.indexer.kpool
    R = x_hat.shape[0]
    assert pos.shape == (R,) and int(pos.min()) >= 0 and int(pos.max()) < cache.latent.shape[1]
    rows = torch.arange(R, device=pos.device)
    qr, q, c = mla_projections(x_hat, weights, spec, num)
    qi, w = indexer_query(qr, x_hat, weights, spec, num)
    ki, gi = indexer_key(x_hat, weights, spec, num)
    W_UK, W_UV = _kv_b(weights, spec, num)
    assert q.shape[1] == W_UK.shape[0], "q_b and kv_b hold different heads"

    latent, index_key, index_gate, pooled_key = (
        num.c(t).clone() for t in (cache.latent, cache.index_key, cache.index_gate, cache.pooled_key)
    )
    latent[rows, pos] = num.store(c)
    index_key[rows, pos] = num.store(ki)
    index_gate[rows, pos] = num.store(gi)
    # the pool holding t completes when n = t+1 fills it; its key comes from the stored keys and gates
    n = pos + 1
    d = rows[n % kp == 0]
    p = pos[d] // kp
    tok = p[:, None] * kp + torch.arange(kp, device=pos.device)  # [R_done, kpool]
    ape = num.c(weights["indexer.index_kpool_compress_ape"])
    pooled_key[d, p] = num.store(pool_key(index_key[d[:, None], tok], index_gate[d[:, None], tok], ape))

    # the indexer is replicated: every rank selects the same tokens
    scores = index_scores(qi, w, pooled_key[:, : int(n.max()) // kp], spec)  # [R, max P]
    idx = select_token_rows(scores, n, spec)  # [R, W]
    if follow is not None:
        idx = follow_selection(scores, n, spec, idx, follow, tie)

    q_lat = num.store(torch.einsum("rhd,hdc->rhc", q, W_UK))  # [R, H, kv_lora], handed to attention in bf16
    # docs/model.md §9 #9: the combined o_lat is handed on in bf16
    o_lat = num.store(sparse_mla(q_lat, latent, idx, mla_scale(spec)))  # [R, H, kv_lora]
    o = num.store(torch.einsum("rhc,hvc->rhv", o_lat, W_UV).flatten(1))  # [R, H*v] o_proj reads it in bf16
    out = linear(o, weights["o_proj.weight"])  # [R, D]
    return DsaOut(out, idx, DsaCache(latent, index_key, index_gate, pooled_key))


def dsa_attention_prefill(
    x_hat_seq: torch.Tensor, weights: Weights, spec: ModelSpec, num: Numerics
) -> tuple[torch.Tensor, torch.Tensor, DsaCache]:
    """One row's T tokens from empty caches -> out_seq [T, D], idx_seq [T, W], cache (R = 1, Lmax = T).

    Unabsorbed: per-head keys and values expanded from the latents, each position attending to the
    tokens selected for it. Latents, keys, gates and pooled keys are num.store-rounded, as the
    decode path reads them back from its bf16 caches.
    """
    kp = spec.indexer.kpool
    T = x_hat_seq.shape[0]
    assert T >= 1
    qr, q, c = mla_projections(x_hat_seq, weights, spec, num)  # [T, q_lora], [T, H, nope], [T, kv_lora]
    qi, w = indexer_query(qr, x_hat_seq, weights, spec, num)  # [T, Hi, ih], [T, Hi]
    ki, gi = indexer_key(x_hat_seq, weights, spec, num)  # [T, ih]
    c, ki, gi = num.store(c), num.store(ki), num.store(gi)

    # every complete pool straight from its kpool raw keys (a pool depends only on its own tokens,
    # so position i reads the first (i+1) // kpool of them)
    Pt = T // kp
    ape = num.c(weights["indexer.index_kpool_compress_ape"])
    pk = num.store(pool_key(ki[: Pt * kp].unflatten(0, (Pt, kp)), gi[: Pt * kp].unflatten(0, (Pt, kp)), ape))
    scores = index_scores(qi, w, pk.expand(T, -1, -1), spec)  # [T, Pt]
    idx = select_token_rows(scores, torch.arange(1, T + 1), spec)  # [T, W]

    W_UK, W_UV = _kv_b(weights, spec, num)
    K = torch.einsum("tc,hdc->thd", c, W_UK)  # [T, H, nope]
    V = torch.einsum("tc,hvc->thv", c, W_UV)  # [T, H, v]
    o = []
    for i in range(T):
        sel = idx[i][idx[i] >= 0]
        s = torch.einsum("hd,jhd->hj", q[i], K[sel]) * mla_scale(spec)  # [H, |S|]
        o.append(torch.einsum("hj,jhv->hv", torch.softmax(s, -1), V[sel]).flatten())
    out = linear(num.store(torch.stack(o)), weights["o_proj.weight"])  # [T, D]
    return out, idx, DsaCache(c[None], ki[None], gi[None], pk[None])
