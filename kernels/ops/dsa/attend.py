"""Sparse MLA decode in absorbed form as Triton bodies (docs/model.md §5.3): attention of every local head over a
row's selected latent rows, in blocks of tokens with log-sum-exp partials, and their combine in a fixed order.
The `sparse` kind's tasks call these bodies; `sparse_mla_launch` runs them as plain launches for the tests.

- `attend_block` (row r, heads h0.., token block b): the block's selected tokens (-1: none) gathered from the
  latent cache; s = q_lat[h] · lat[n] × scale; the block's max m, l = Σ exp(s - m) and o = Σ exp(s - m) lat[n]
  (fp32), stored as the block's partial. A block with no valid token stores m = -inf, l = 0, o = 0.
- `combine_blocks` (row r, heads h0..): M = max over blocks of m; o_lat = Σ_b exp(m_b - M) o_b / Σ_b exp(m_b - M)
  l_b, the blocks in ascending order: the same bits whatever the grid or schedule. Stored bf16 (what W_UV reads).

The latent rows are read once per (row, head group): at TP8 a rank has 8 heads, one group of 16 (the smallest
`tl.dot` tile), so every block is one gather of its tokens' rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import mma
from glm53ctl.kernels.tlx import interpreting, to_bf16


@triton.jit
def attend_block(
    q_lat,
    latent,
    idx,
    part_o,
    part_m,
    part_l,
    r,
    h0,
    b,
    H: tl.constexpr,
    C: tl.constexpr,
    WIDTH: tl.constexpr,
    NB: tl.constexpr,
    TB: tl.constexpr,
    HB: tl.constexpr,
    LMAX: tl.constexpr,
    scale,
    INTERPRET: tl.constexpr,
):
    """Block b of row r's selected tokens for heads h0..h0 + HB: q_lat [R, H, C] bf16, latent [R, LMAX, C] bf16,
    idx [R, WIDTH] int32 -> part_o [R, NB, H, C] fp32, part_m and part_l [R, NB, H] fp32."""
    o_t = b * TB + tl.arange(0, TB)
    o_h = h0 + tl.arange(0, HB)
    o_c = tl.arange(0, C)
    tok = tl.load(idx + r * WIDTH + o_t, mask=o_t < WIDTH, other=-1)
    valid = tok >= 0
    base = latent + r.to(tl.int64) * LMAX * C
    lat = tl.load(base + tl.maximum(tok, 0)[:, None].to(tl.int64) * C + o_c[None, :], mask=valid[:, None], other=0.0)
    q = tl.load(q_lat + (r * H + o_h[:, None]) * C + o_c[None, :], mask=o_h[:, None] < H, other=0.0)
    s = mma(tl.zeros((HB, TB), dtype=tl.float32), q, lat, INTERPRET) * scale
    s = tl.where(valid[None, :], s, float("-inf"))
    m = tl.max(s, axis=1)
    p = tl.exp(s - tl.where(m == float("-inf"), 0.0, m)[:, None])  # 0 at every invalid token
    l = tl.sum(p, axis=1)
    # o = p @ lat: p [HB, TB] against lat^T [C, TB] as the MMA's (rows, K) pair
    o = mma(tl.zeros((HB, C), dtype=tl.float32), to_bf16(p, INTERPRET), tl.trans(lat), INTERPRET)
    m_h = o_h < H
    at = (r * NB + b) * H + o_h
    tl.store(part_o + at[:, None] * C + o_c[None, :], o, mask=m_h[:, None])
    tl.store(part_m + at, m, mask=m_h)
    tl.store(part_l + at, l, mask=m_h)


@triton.jit
def combine_blocks(
    part_o,
    part_m,
    part_l,
    o_lat,
    r,
    h0,
    c0,
    nblocks,
    H: tl.constexpr,
    C: tl.constexpr,
    NB: tl.constexpr,
    NBP: tl.constexpr,
    HB: tl.constexpr,
    CC: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Row r's heads h0..h0 + HB over latent columns c0..c0 + CC: its first `nblocks` blocks' partials combined
    into o_lat [R, H, C] bf16. Every block's partials in one load ([NBP, HB, CC], NBP: NB padded to a power of
    two) and one sum over the blocks: a loop over them, a load's round trip each, took 14.5 µs a task at
    glm53_flash's 33 blocks (H200, TP8 rows 1, 4K)."""
    o_h = h0 + tl.arange(0, HB)
    o_c = c0 + tl.arange(0, CC)
    o_b = tl.arange(0, NBP)
    m_h = o_h < H
    m_bh = (o_b[:, None] < nblocks) & m_h[None, :]
    at = (r * NB + o_b[:, None]) * H + o_h[None, :]
    b_m = tl.load(part_m + at, mask=m_bh, other=float("-inf"))
    M = tl.max(b_m, axis=0)
    M = tl.where(M == float("-inf"), 0.0, M)
    f = tl.exp(b_m - M[None, :])  # 0 for a block past nblocks or a padded head
    L = tl.sum(f * tl.load(part_l + at, mask=m_bh, other=0.0), axis=0)
    b_o = tl.load(part_o + at[:, :, None] * C + o_c[None, None, :], mask=m_bh[:, :, None], other=0.0)
    acc = tl.sum(f[:, :, None] * b_o, axis=0)
    out = acc / tl.where(L > 0, L, 1.0)[:, None]  # L > 0 for every head of a row with a token; padded heads 0
    tl.store(o_lat + (r * H + o_h[:, None]) * C + o_c[None, :], to_bf16(out, INTERPRET), mask=m_h[:, None])


# ---- plain launches of the bodies (tests; the kind runs them as tasks)


@triton.jit
def _attend_kernel(
    q_lat,
    latent,
    idx,
    part_o,
    part_m,
    part_l,
    scale,
    H: tl.constexpr,
    C: tl.constexpr,
    WIDTH: tl.constexpr,
    NB: tl.constexpr,
    TB: tl.constexpr,
    HB: tl.constexpr,
    LMAX: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Program (block, head group, row)."""
    attend_block(
        q_lat,
        latent,
        idx,
        part_o,
        part_m,
        part_l,
        tl.program_id(2),
        tl.program_id(1) * HB,
        tl.program_id(0),
        H,
        C,
        WIDTH,
        NB,
        TB,
        HB,
        LMAX,
        scale,
        INTERPRET,
    )


@triton.jit
def _combine_kernel(
    part_o,
    part_m,
    part_l,
    o_lat,
    H: tl.constexpr,
    C: tl.constexpr,
    NB: tl.constexpr,
    NBP: tl.constexpr,
    HB: tl.constexpr,
    CC: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """Program (head group, row, column chunk)."""
    r, h0, c0 = tl.program_id(1), tl.program_id(0) * HB, tl.program_id(2) * CC
    combine_blocks(part_o, part_m, part_l, o_lat, r, h0, c0, NB, H, C, NB, NBP, HB, CC, INTERPRET)


def sparse_mla_launch(
    q_lat: torch.Tensor,
    latent: torch.Tensor,
    idx: torch.Tensor,
    scale: float,
    token_block: int = 64,
    combine_cols: int = 64,
) -> torch.Tensor:
    """o_lat [R, H, C] bf16 of q_lat [R, H, C], latent [R, LMAX, C] and idx [R, WIDTH] (-1: none), as the
    reference's `sparse_mla`, through token blocks of `token_block` and their combine over chunks of
    `combine_cols` latent columns."""
    R, H, C = q_lat.shape
    LMAX, WIDTH = latent.shape[1], idx.shape[1]
    NB = triton.cdiv(WIDTH, token_block)
    HB = max(16, triton.next_power_of_2(min(H, 64)))
    dev = q_lat.device
    f32 = dict(dtype=torch.float32, device=dev)
    part_o, part_m, part_l = torch.empty(R, NB, H, C, **f32), torch.empty(R, NB, H, **f32), torch.empty(R, NB, H, **f32)
    o_lat = torch.empty(R, H, C, dtype=torch.bfloat16, device=dev)
    q = q_lat.to(torch.bfloat16).contiguous()
    lat = latent.to(torch.bfloat16).contiguous()
    ix = idx.to(torch.int32).contiguous()
    interp = interpreting()
    groups = triton.cdiv(H, HB)
    _attend_kernel[(NB, groups, R)](
        q,
        lat,
        ix,
        part_o,
        part_m,
        part_l,
        scale,
        H=H,
        C=C,
        WIDTH=WIDTH,
        NB=NB,
        TB=token_block,
        HB=HB,
        LMAX=LMAX,
        INTERPRET=interp,
    )
    cc = min(combine_cols, C)
    assert C % cc == 0, "the combine runs over whole column chunks"
    _combine_kernel[(groups, R, C // cc)](
        part_o, part_m, part_l, o_lat, H=H, C=C, NB=NB, NBP=triton.next_power_of_2(NB), HB=HB, CC=cc, INTERPRET=interp
    )
    return o_lat
