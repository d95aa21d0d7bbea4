"""kernels/ops/dsa/naive.py: decode steps against the prefill formulation, docs/model.md §11 traps 1-5, top-k
ties, TP."""

from __future__ import annotations

import math

import pytest
import torch

from glm53ctl.kernels.numerics import FP32, FP64, Numerics, rel_rms
from glm53ctl.kernels.ops.dsa.naive import (
    dsa_attention,
    dsa_attention_prefill,
    index_scores,
    indexer_key,
    indexer_query,
    mla_projections,
    mla_scale,
    pool_key,
    select_tokens,
    sparse_mla,
)
from glm53ctl.kernels.spec import ModelSpec, load_model
from glm53ctl.kernels.state import DsaCache
from tests.helpers import assert_close

SPEC = load_model("tiny")
KP = SPEC.indexer.kpool


def make_weights(spec: ModelSpec = SPEC) -> dict[str, torch.Tensor]:
    """Random TP1 weights, bf16 like the checkpoint (the ape fp32), scaled to O(1) activations."""
    w = {}
    for name, shape in spec.shards(1).weight_shapes()["dsa"].items():
        if name.endswith("norm.weight"):
            t = 1 + 0.1 * torch.randn(shape)
        elif name.endswith("bias"):
            t = 0.1 * torch.randn(shape)
        elif name.endswith("ape"):
            t = 0.5 * torch.randn(shape)
        else:
            t = torch.randn(shape) / math.sqrt(shape[-1])
        w[name] = t if name.endswith("ape") else t.bfloat16()
    return w


def shard(weights: dict[str, torch.Tensor], spec: ModelSpec, tp: int, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s share (docs/model.md §8): q_b, kv_b by head rows, o_proj by head columns; the rest replicated."""
    m = spec.mla
    H = m.heads // tp
    heads = slice(rank * H, (rank + 1) * H)
    w = dict(weights)
    w["q_b_proj.weight"] = weights["q_b_proj.weight"].unflatten(0, (m.heads, -1))[heads].flatten(0, 1)
    w["kv_b_proj.weight"] = weights["kv_b_proj.weight"].unflatten(0, (m.heads, -1))[heads].flatten(0, 1)
    w["o_proj.weight"] = weights["o_proj.weight"].unflatten(1, (m.heads, -1))[:, heads].flatten(1)
    return w


def empty_cache(R: int, Lmax: int, num: Numerics) -> DsaCache:
    s = SPEC.shards(1).state_shapes(R, Lmax)
    z = lambda k: torch.zeros(s[k], dtype=num.dtype)
    return DsaCache(z("dsa.latent"), z("dsa.index_key"), z("dsa.index_gate"), z("dsa.pooled_key"))


def prefilled_cache(x: torch.Tensor, lens: list[int], Lmax: int, weights, num: Numerics) -> DsaCache:
    """Rows brought to context lens[r] through the prefill of x[r, :lens[r]], padded with zeros to Lmax."""
    cache = empty_cache(len(lens), Lmax, num)
    for r, L in enumerate(lens):
        if L == 0:
            continue
        _, _, c = dsa_attention_prefill(x[r, :L], weights, SPEC, num)
        cache.latent[r, :L] = c.latent[0]
        cache.index_key[r, :L] = c.index_key[0]
        cache.index_gate[r, :L] = c.index_gate[0]
        cache.pooled_key[r, : L // KP] = c.pooled_key[0]
    return cache


def decode(x: torch.Tensor, lens: list[int], steps: int, Lmax: int, weights, num: Numerics):
    """Rows at positions lens[r] decode `steps` tokens together -> out [R, steps, D], idx [R, steps, W], cache."""
    cache = prefilled_cache(x, lens, Lmax, weights, num)
    pos = torch.tensor(lens)
    outs, idxs = [], []
    for k in range(steps):
        fields = lambda c: (c.latent, c.index_key, c.index_gate, c.pooled_key)
        before = [t.clone() for t in fields(cache)]
        res = dsa_attention(x[torch.arange(len(lens)), pos + k], weights, cache, pos + k, SPEC, num)
        assert all(torch.equal(a, b) for a, b in zip(before, fields(cache), strict=True)), "input cache written"
        outs.append(res.out)
        idxs.append(res.idx)
        cache = res.cache
    return torch.stack(outs, 1), torch.stack(idxs, 1), cache


def check_idx(idx: torch.Tensor, n: int) -> None:
    """A valid selection for n cached tokens: ascending, in range, whole pools plus the tail, -1 padded."""
    P = n // KP
    valid = idx[idx >= 0]
    m = valid.numel()
    assert (idx[m:] == -1).all() and idx.numel() == SPEC.index_width
    assert (valid.diff() > 0).all() and valid.min() >= 0 and valid.max() < n
    assert m == min(P, SPEC.index_pools) * KP + n - P * KP
    assert torch.equal(valid[m - (n - P * KP) :], torch.arange(P * KP, n))
    pooled = valid[: m - (n - P * KP)].view(-1, KP)
    assert torch.equal(pooled, pooled[:, :1] + torch.arange(KP))
    assert (pooled[:, 0] % KP == 0).all()


# ---- decode vs prefill ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "lens,steps",
    [
        pytest.param([0, 0], 60, id="R2-same-pos-T60"),
        pytest.param([0, 13, 37], 21, id="R3-pos0-13-37-steps21"),
    ],
)
def test_dsa_attention_vs_prefill_fp64(lens, steps):
    torch.manual_seed(42)
    weights = make_weights()
    T = max(lens) + steps
    x = torch.randn(len(lens), T, SPEC.hidden)
    out, idx, cache = decode(x, lens, steps, T, weights, FP64)
    excluded = included = 0
    for r, L in enumerate(lens):
        ref, ref_idx, ref_cache = dsa_attention_prefill(x[r, : L + steps], weights, SPEC, FP64)
        assert_close(f"out row {r}", ref[L:], out[r], 1e-10)
        assert torch.equal(ref_idx[L:], idx[r])
        for name in ("latent", "index_key", "index_gate", "pooled_key"):
            got, want = getattr(cache, name)[r], getattr(ref_cache, name)[0]
            assert_close(f"{name} row {r}", want, got[: want.shape[0]], 1e-12)
        for k in range(steps):
            t = L + k
            check_idx(idx[r, k], t + 1)
            # the current token is attended iff it is in the tail or its (just completed) pool is selected
            if (t + 1) % KP == 0 and t + 1 > SPEC.indexer.topk:
                excluded += int(t not in idx[r, k])
                included += int(t in idx[r, k])
    # contexts past topk really drop pools, the just-completed one among them
    assert excluded > 0 and included > 0


def test_dsa_attention_vs_prefill_fp32():
    torch.manual_seed(42)
    weights = make_weights()
    x = torch.randn(1, 48, SPEC.hidden)
    out, idx, _ = decode(x, [0], 48, 48, weights, FP32)
    ref, ref_idx, _ = dsa_attention_prefill(x[0], weights, SPEC, FP32)
    # the decode path also rounds o_lat to bf16, the unabsorbed prefill has no o_lat
    assert_close("out fp32", ref, out[0], 1e-2)
    assert torch.equal(ref_idx, idx[0])


def test_sparse_mla_reads_only_selected():
    torch.manual_seed(42)
    R, H, L, C = 2, 3, 40, SPEC.mla.kv_lora_rank
    q_lat, latent = torch.randn(R, H, C, dtype=torch.float64), torch.randn(R, L, C, dtype=torch.float64)
    idx = torch.full((R, SPEC.index_width), -1)
    idx[0, :5] = torch.tensor([0, 1, 2, 3, 39])
    idx[1, :9] = torch.tensor([4, 5, 6, 7, 20, 21, 22, 23, 36])
    ref = sparse_mla(q_lat, latent, idx, 0.2)
    other = torch.ones(R, L, dtype=torch.bool)
    other[torch.arange(R)[:, None], idx.clamp(min=0)] = False
    poked = latent + 100 * other[..., None]
    assert torch.equal(ref, sparse_mla(q_lat, poked, idx, 0.2))
    for r in range(R):
        sel = idx[r][idx[r] >= 0]
        p = torch.softmax(q_lat[r] @ latent[r, sel].T * 0.2, -1)
        assert_close(f"hand row {r}", p @ latent[r, sel], ref[r], 1e-14)


# ---- traps (docs/model.md §11) -----------------------------------------------------------------------


def test_trap1_mla_scale():
    """Dense context (n <= index_width): the decode step equals HF's expanded attention with 1/sqrt(nope)."""
    torch.manual_seed(42)
    weights = make_weights()
    m, t = SPEC.mla, 20
    x = torch.randn(1, t + 1, SPEC.hidden, dtype=torch.float64)
    cache = prefilled_cache(x, [t], t + 1, weights, FP64)
    got = dsa_attention(x[:, t], weights, cache, torch.tensor([t]), SPEC, FP64).out[0]

    W = {k: v.double() for k, v in weights.items()}
    rms = lambda y, g: y / (y.pow(2).mean(-1, keepdim=True) + SPEC.model.rms_norm_eps).sqrt() * g
    c = rms(x[0] @ W["kv_a_proj_with_mqa.weight"].T, W["kv_a_layernorm.weight"])  # [t+1, kv_lora]
    qr = rms(x[0, t] @ W["q_a_proj.weight"].T, W["q_a_layernorm.weight"])
    q = (qr @ W["q_b_proj.weight"].T).view(m.heads, m.qk_nope_head_dim)
    kv = (c @ W["kv_b_proj.weight"].T).view(t + 1, m.heads, -1)
    K, V = kv[..., : m.qk_nope_head_dim], kv[..., m.qk_nope_head_dim :]

    def hf(scale: float) -> torch.Tensor:
        p = torch.softmax(torch.einsum("hd,jhd->hj", q, K) * scale, -1)
        return torch.einsum("hj,jhv->hv", p, V).flatten() @ W["o_proj.weight"].T

    assert mla_scale(SPEC) == m.qk_nope_head_dim**-0.5
    assert_close("vs 1/sqrt(qk_head_dim)", hf(m.qk_nope_head_dim**-0.5), got, 1e-12)
    assert rel_rms(hf(m.kv_lora_rank**-0.5), got) > 1e-2


def test_trap2_indexer_key_layernorm():
    torch.manual_seed(42)
    weights = {k: v.double() for k, v in make_weights().items()}
    x = torch.randn(5, SPEC.hidden, dtype=torch.float64)
    ki, gi = indexer_key(x, weights, SPEC, FP64)
    y = x @ weights["indexer.wk.weight"].T
    g, b = weights["indexer.k_norm.weight"], weights["indexer.k_norm.bias"]
    eps = SPEC.indexer.norm_eps
    ln = (y - y.mean(-1, keepdim=True)) / (y.var(-1, unbiased=False, keepdim=True) + eps).sqrt() * g + b
    assert_close("LayerNorm", ln, ki, 1e-13)
    assert_close("gate", x @ weights["indexer.index_kpool_compress_gate.weight"].T, gi, 1e-14)
    # a shift common to all channels is removed by a LayerNorm, not by an RMSNorm
    u = torch.randn(SPEC.hidden, dtype=torch.float64)
    shifted = dict(weights)
    shifted["indexer.wk.weight"] = weights["indexer.wk.weight"] + u
    assert_close("shift-invariant", ki, indexer_key(x, shifted, SPEC, FP64)[0], 1e-12)
    rms = y / (y.pow(2).mean(-1, keepdim=True) + eps).sqrt() * g + b
    assert rel_rms(rms, ki) > 1e-2


def test_trap3_pool_key_softmax_over_positions():
    torch.manual_seed(42)
    ih = SPEC.indexer.head_dim
    keys, gates = torch.randn(6, KP, ih, dtype=torch.float64), torch.randn(6, KP, ih, dtype=torch.float64)
    ape = torch.randn(KP, ih)
    pk = pool_key(keys, gates, ape)
    hand = torch.empty(6, ih, dtype=torch.float64)
    for p in range(6):
        for ch in range(ih):
            e = [math.exp(gates[p, j, ch].item() + ape[j, ch].item()) for j in range(KP)]
            hand[p, ch] = sum(e[j] * keys[p, j, ch].item() for j in range(KP)) / sum(e)
    assert_close("per-channel softmax over positions", hand, pk, 1e-14)
    # a convex mix per channel: keys equal across the pool come back unchanged, whatever the gates
    same = keys[:, :1].expand(-1, KP, -1)
    assert_close("constant keys", keys[:, 0], pool_key(same, gates, ape), 1e-14)
    over_channels = (torch.softmax(gates + ape.double(), -1) * keys).sum(-2)
    assert rel_rms(over_channels, pk) > 1e-1


def test_trap4_index_scores_relu_then_weighted_sum():
    torch.manual_seed(42)
    ix = SPEC.indexer
    weights = {k: v.double() for k, v in make_weights().items()}
    x = torch.randn(3, SPEC.hidden, dtype=torch.float64)
    qr = torch.randn(3, SPEC.mla.q_lora_rank, dtype=torch.float64)
    pooled = torch.randn(3, 10, ix.head_dim, dtype=torch.float64)
    qi, w = indexer_query(qr, x, weights, SPEC, FP64)
    got = index_scores(qi, w, pooled, SPEC)  # [3, 10]

    wq = weights["indexer.wq_b.weight"].view(ix.heads, ix.head_dim, -1)
    raw_w = x @ weights["indexer.weights_proj.weight"].T  # [3, Hi]
    assert (raw_w < 0).any() and (raw_w > 0).any()
    hand = torch.zeros(3, 10, dtype=torch.float64)
    for r in range(3):
        for p in range(10):
            for h in range(ix.heads):
                dot = (wq[h] @ qr[r]) @ pooled[r, p]
                hand[r, p] += raw_w[r, h] * ix.heads**-0.5 * max(dot.item() * ix.head_dim**-0.5, 0.0)
    assert_close("hand", hand, got, 1e-13)
    dots = torch.einsum("rhc,rpc->rhp", qi, pooled) * ix.head_dim**-0.5
    assert rel_rms(torch.relu((w[..., None] * dots).sum(1)), got) > 1e-1


def test_trap5_select_pools_then_tail():
    n = 50  # P = 12 complete pools, 8 selected, tail 48, 49
    scores = torch.tensor([0.5, -1, 3, 0, 0, 2, 1, -2, 0.7, 0, 4, 0.1])
    pools = [0, 2, 3, 5, 6, 8, 10, 11]  # by score: 10 2 5 6 8 0 11, then 3 first of the zeros 3 4 9
    want = [KP * p + j for p in pools for j in range(KP)] + [48, 49]
    want += [-1] * (SPEC.index_width - len(want))
    assert SPEC.index_width == 35
    for dtype in (torch.float32, torch.float64):
        assert select_tokens(scores.to(dtype), n, SPEC).tolist() == want
    assert select_tokens(torch.randn(1), 7, SPEC).tolist() == list(range(7)) + [-1] * 28
    assert select_tokens(torch.randn(2), 8, SPEC).tolist() == list(range(8)) + [-1] * 27
    assert select_tokens(torch.zeros(0), 3, SPEC).tolist() == [0, 1, 2] + [-1] * 32
    # n = 36: nine complete pools, the lowest-scored one dropped, no tail
    got = select_tokens(torch.arange(9.0, 0, -1), 36, SPEC)
    assert got.tolist() == list(range(32)) + [-1] * 3


# ---- top-k ties --------------------------------------------------------------------------------


def test_select_ties_exact_zero_scores():
    """All heads negative on most pools: exact-zero scores, broken by pool index in fp32 and fp64 alike."""
    torch.manual_seed(42)
    ix, P = SPEC.indexer, 20
    qi = torch.rand(1, ix.heads, ix.head_dim) + 0.1
    w = torch.randn(1, ix.heads)
    sign = torch.ones(P)
    sign[torch.randperm(P)[:14]] = -1  # 14 pools with keys < 0 on every channel: every head's dot < 0
    pooled = (torch.rand(1, P, ix.head_dim) + 0.1) * sign[:, None]
    n = P * KP + 3
    sel = {}
    for dtype in (torch.float32, torch.float64):
        scores = index_scores(qi.to(dtype), w.to(dtype), pooled.to(dtype), SPEC)[0]
        assert (scores[sign < 0] == 0).all()
        sel[dtype] = select_tokens(scores, n, SPEC)
        order = sorted(range(P), key=lambda p: (-scores[p].item(), p))[: SPEC.index_pools]
        want = [KP * p + j for p in sorted(order) for j in range(KP)] + list(range(P * KP, n))
        assert sel[dtype][: len(want)].tolist() == want
        check_idx(sel[dtype], n)
    assert torch.equal(sel[torch.float32], sel[torch.float64])


def test_dsa_attention_all_scores_zero():
    """qi = 0: every pool scores exactly 0, so the first index_pools pools and the tail are taken."""
    torch.manual_seed(42)
    weights = make_weights()
    weights["indexer.wq_b.weight"] = torch.zeros_like(weights["indexer.wq_b.weight"])
    t = 49
    x = torch.randn(1, t + 1, SPEC.hidden)
    want = list(range(SPEC.indexer.topk)) + [48, 49] + [-1]
    for num in (FP32, FP64):
        cache = prefilled_cache(x, [t], t + 1, weights, num)
        idx = dsa_attention(x[:, t], weights, cache, torch.tensor([t]), SPEC, num).idx
        assert idx[0].tolist() == want
        assert dsa_attention_prefill(x[0], weights, SPEC, num)[1][t].tolist() == want


# ---- TP ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4, 8], ids=lambda t: f"TP{t}")
def test_dsa_attention_tp_partials_sum(tp):
    torch.manual_seed(42)
    weights = make_weights()
    lens = [5, 22, 43]  # the last row completes pool 10 of 11 and drops pools
    x = torch.randn(len(lens), 48, SPEC.hidden)
    cache = prefilled_cache(x, lens, 48, weights, FP64)
    pos = torch.tensor(lens)
    x_t = x[torch.arange(len(lens)), pos]
    ref = dsa_attention(x_t, weights, cache, pos, SPEC, FP64)
    parts = [dsa_attention(x_t, shard(weights, SPEC, tp, r), cache, pos, SPEC, FP64) for r in range(tp)]
    assert parts[0].out.shape == ref.out.shape
    assert_close(f"sum of {tp} partials", ref.out, sum(p.out for p in parts), 1e-12)
    for p in parts:
        assert torch.equal(p.idx, ref.idx)
        assert torch.equal(p.cache.pooled_key, ref.cache.pooled_key)
        assert torch.equal(p.cache.latent, ref.cache.latent)


def test_mla_projections_shapes_per_rank():
    torch.manual_seed(42)
    weights = make_weights()
    x = torch.randn(2, SPEC.hidden)
    m = SPEC.mla
    qr, q, c = mla_projections(x, shard(weights, SPEC, 4, 1), SPEC, FP32)
    assert qr.shape == (2, m.q_lora_rank) and q.shape == (2, m.heads // 4, m.qk_nope_head_dim)
    assert c.shape == (2, m.kv_lora_rank) and c.dtype == torch.float32


def test_the_reference_follows_a_launchs_selection_only_at_a_near_tie():
    """A launch's pools tying the reference's TOPP-th score (within SELECT_TIE of the row's scale) are taken; a pool
    scoring clearly lower is not."""
    from glm53ctl.kernels.ops.dsa.naive import SELECT_TIE, follow_selection, select_token_rows

    spec = load_model("tiny")
    P = spec.index_pools + 2
    n = torch.tensor([P * spec.indexer.kpool] * 2)
    scores = torch.linspace(1.0, 2.0, P).repeat(2, 1)  # the reference takes pools 2..P-1
    scores[0, 1] = scores[0, 2] - SELECT_TIE / 4  # row 0: pool 1 ties pool 2
    own = select_token_rows(scores, n, spec)
    tipped = scores.clone()
    tipped[:, 1], tipped[:, 2] = scores[:, 2], scores[:, 1]
    theirs = select_token_rows(tipped, n, spec)  # the launch took pool 1, not pool 2
    assert not torch.equal(own[0], theirs[0])
    got = follow_selection(scores, n, spec, own, theirs)
    assert torch.equal(got[0], theirs[0]) and torch.equal(got[1], own[1])


def test_the_reference_never_follows_a_selection_that_is_not_whole_pools():
    """A launch's tokens that are not its pools expanded in order are never followed, tie or not."""
    from glm53ctl.kernels.ops.dsa.naive import follow_selection, select_token_rows

    spec = load_model("tiny")
    P = spec.index_pools + 2
    n = torch.tensor([P * spec.indexer.kpool])
    scores = torch.ones(1, P)  # every pool ties
    own = select_token_rows(scores, n, spec)
    theirs = own.clone()
    theirs[0, 3] = theirs[0, 3] + 1  # one token of the first pool moved into the next
    assert torch.equal(follow_selection(scores, n, spec, own, theirs), own)
