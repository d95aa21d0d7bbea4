"""One DSA layer's attention part as Triton bodies (docs/model.md §5), and `dsa_launch`: the whole part as plain
launches, one per step, for the tests (the `sparse` kind will run the same bodies as tasks).

The steps, in order (a rank's shapes; the indexer and the latent cache are replicated on every rank):

1. The fused A projection: q_a | kv_a | the indexer's wk | its pool gate | its head weights, one GEMV over x̂.
2. `mla_row` (row r at position pos): qr = RMSNorm(q_a) (bf16, what q_b reads), c = RMSNorm(kv_a) into the
   latent cache at pos, the indexer key (LayerNorm with bias) and gate into theirs at pos, the head weights
   (× Hi^-0.5); when the step completes a pool, its key into the pooled-key cache. Every write is at the row's
   position: a faulted step retried writes the same bits.
3. q_b | the indexer's wq_b over qr; the absorb q_lat[h] = q[h] @ W_UK[h] (bf16).
4. The index scores of the row's complete pools (indexer.py), its selection (select.py).
5. Attention over the selected latent rows in token blocks and their combine (attend.py): o_lat (bf16).
6. o[h] = W_UV[h] @ o_lat[h] (bf16), then o_proj: this rank's partial, which the layer's reduce adds.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.dsa.attend import sparse_mla_launch
from glm53ctl.kernels.ops.dsa.indexer import layer_norm_row, pool_key_row, scores_launch
from glm53ctl.kernels.ops.dsa.naive import DsaOut, mla_scale
from glm53ctl.kernels.ops.dsa.select import select_launch
from glm53ctl.kernels.ops.gemv.kernel import gemv
from glm53ctl.kernels.state import DsaCache
from glm53ctl.kernels.tlx import interpreting, to_bf16

# the fused A projection's row blocks, in order (what `a_weight` stacks)
A_BLOCKS = ("q_a_proj", "kv_a_proj_with_mqa", "indexer.wk", "indexer.index_kpool_compress_gate", "indexer.weights_proj")


@triton.jit
def _rms_row(x, m, w, N, eps):
    """RMSNorm of one row x (masked to m) over N elements, times weight w (bf16 values)."""
    return x * tl.rsqrt(tl.sum(tl.where(m, x * x, 0.0), axis=0) / N + eps) * w.to(tl.float32)


@triton.jit
def mla_row(
    y,
    qr,
    wi,
    latent,
    index_key,
    index_gate,
    pooled,
    q_norm,
    kv_norm,
    k_w,
    k_b,
    ape,
    r,
    pos,
    eps,
    ln_eps,
    QL: tl.constexpr,
    QLP: tl.constexpr,
    C: tl.constexpr,
    IH: tl.constexpr,
    HI: tl.constexpr,
    KP: tl.constexpr,
    LMAX: tl.constexpr,
    INTERPRET: tl.constexpr,
    PART=-1,
):
    """Row r's step after the A projection y [R, QL + C + 2 IH + HI] fp32 (QLP: QL padded to a power of 2): qr
    [R, QL] bf16 (part 0: what q_b waits for), then (part 1) the head weights wi [R, HI] fp32 and the caches'
    writes at pos (latent [R, LMAX, C], index_key and index_gate [R, LMAX, IH], pooled [R, LMAX // KP, IH], all
    bf16); PART -1 both. Two parts, so q_b's stream need not wait for the caches' writes."""
    NA: tl.constexpr = QL + C + 2 * IH + HI
    base = y + r * NA
    if PART != 1:
        o_q = tl.arange(0, QLP)
        m_q = o_q < QL
        a = tl.load(base + o_q, mask=m_q, other=0.0)
        a = _rms_row(a, m_q, tl.load(q_norm + o_q, mask=m_q, other=0.0), QL, eps)
        tl.store(qr + r * QL + o_q, to_bf16(a, INTERPRET), mask=m_q)
    if PART != 0:
        row = r.to(tl.int64) * LMAX + pos
        o_c = tl.arange(0, C)
        c = tl.load(base + QL + o_c)
        tl.store(latent + row * C + o_c, to_bf16(_rms_row(c, o_c < C, tl.load(kv_norm + o_c), C, eps), INTERPRET))
        o_i = tl.arange(0, IH)
        ki = layer_norm_row(tl.load(base + QL + C + o_i), k_w, k_b, ln_eps, IH)
        tl.store(index_key + row * IH + o_i, to_bf16(ki, INTERPRET))
        tl.store(index_gate + row * IH + o_i, to_bf16(tl.load(base + QL + C + IH + o_i), INTERPRET))
        o_h = tl.arange(0, HI)
        tl.store(wi + r * HI + o_h, tl.load(base + QL + C + 2 * IH + o_h) * (HI**-0.5))
        if (pos + 1) % KP == 0:  # this step completes pool p: its key from its tokens' stored keys and gates
            tl.debug_barrier()  # this row's key and gate stored (by every thread) before they are read back
            first = row - (KP - 1)
            p = (pos + 1) // KP - 1
            pool_key_row(
                index_key + first * IH,
                index_gate + first * IH,
                ape,
                pooled + (r.to(tl.int64) * (LMAX // KP) + p) * IH,
                KP,
                IH,
                INTERPRET,
            )


@triton.jit
def _mla_row_kernel(
    y, qr, wi, latent, index_key, index_gate, pooled, q_norm, kv_norm, k_w, k_b, ape, pos, eps, ln_eps,
    QL: tl.constexpr, QLP: tl.constexpr, C: tl.constexpr, IH: tl.constexpr, HI: tl.constexpr, KP: tl.constexpr,
    LMAX: tl.constexpr, INTERPRET: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    mla_row(
        y, qr, wi, latent, index_key, index_gate, pooled, q_norm, kv_norm, k_w, k_b, ape, r, tl.load(pos + r),
        eps, ln_eps, QL, QLP, C, IH, HI, KP, LMAX, INTERPRET,
    )  # fmt: skip


def a_weight(w) -> torch.Tensor:
    """The fused A projection's weight [QL + C + 2 IH + HI, D] bf16 (A_BLOCKS stacked)."""
    return torch.cat([w[f"{n}.weight"] for n in A_BLOCKS]).to(torch.bfloat16).contiguous()


def dsa_launch(x_hat: torch.Tensor, w, cache: DsaCache, pos: torch.Tensor, spec) -> DsaOut:
    """One rank's DSA attention part as plain launches: x̂ [R, D], this rank's `self_attn.` weights, the caches
    (replicated; not written: new ones come back) and pos [R]. As the reference's `dsa_attention`."""
    R, D = x_hat.shape
    dev = x_hat.device
    m, ix = spec.mla, spec.indexer
    QL, C, IH, HI, KP = m.q_lora_rank, m.kv_lora_rank, ix.head_dim, ix.heads, ix.kpool
    nope, v = m.qk_nope_head_dim, m.v_head_dim
    bf = lambda t: t.to(torch.bfloat16).contiguous()  # noqa: E731
    x = bf(x_hat)
    y = gemv(x, a_weight(w))
    latent, index_key, index_gate, pooled = (
        bf(t).clone() for t in (cache.latent, cache.index_key, cache.index_gate, cache.pooled_key)
    )
    LMAX = latent.shape[1]
    qr = torch.empty(R, QL, dtype=torch.bfloat16, device=dev)
    wi = torch.empty(R, HI, dtype=torch.float32, device=dev)
    p32 = pos.to(torch.int32).to(dev).contiguous()
    _mla_row_kernel[(R,)](
        y, qr, wi, latent, index_key, index_gate, pooled,
        bf(w["q_a_layernorm.weight"]), bf(w["kv_a_layernorm.weight"]), bf(w["indexer.k_norm.weight"]),
        bf(w["indexer.k_norm.bias"]), w["indexer.index_kpool_compress_ape"].float().contiguous(), p32,
        spec.model.rms_norm_eps, ix.norm_eps,
        QL=QL, QLP=triton.next_power_of_2(QL), C=C, IH=IH, HI=HI, KP=KP, LMAX=LMAX, INTERPRET=interpreting(),
    )  # fmt: skip
    # q_lora need not be a power of 2 (tiny: 96): K tiles that divide it
    qb = gemv(qr, bf(torch.cat([w["q_b_proj.weight"], w["indexer.wq_b.weight"]])), block_k=math.gcd(QL, 128))
    H = w["q_b_proj.weight"].shape[0] // nope
    q = bf(qb[:, : H * nope]).view(R, H, nope)
    qi = qb[:, H * nope :].reshape(R, HI, IH)
    kv_b = w["kv_b_proj.weight"].view(H, nope + v, C)
    q_lat = torch.stack([gemv(bf(q[:, h]), bf(kv_b[h, :nope].t())) for h in range(H)], dim=1)  # [R, H, C]
    n = pos.to(dev) + 1
    scores = scores_launch(qi, wi, pooled, n // KP, spec)
    idx = select_launch(scores, n, spec)
    o_lat = sparse_mla_launch(bf(q_lat), latent, idx, mla_scale(spec))
    o = torch.cat([gemv(bf(o_lat[:, h]), bf(kv_b[h, nope:])) for h in range(H)], dim=1)  # [R, H * v]
    out = gemv(bf(o), bf(w["o_proj.weight"]))
    return DsaOut(out, idx.long(), DsaCache(latent, index_key, index_gate, pooled))
