"""The GEMV helpers under TRITON_INTERPRET=1: the folded GEMV's stream sum adds the streams in stream order; K
tiles preloaded before a wait sum to gemv_tile's bits."""

import pytest
import torch
import triton
import triton.language as tl

from glm53ctl.kernels.dense.kernel import preloaded_tiles
from glm53ctl.kernels.gemv import gemv_tile, gemv_tile_acc, load_w_tiles, mma_w_tiles, sum_streams
from glm53ctl.kernels.tlx import interpreting

pytestmark = pytest.mark.interpreter


@triton.jit
def _sum_streams_kernel(a, y, M: tl.constexpr, BN: tl.constexpr):
    o_m = tl.arange(0, M)
    o_n = tl.arange(0, BN)
    r = sum_streams(tl.load(a + o_m[:, None] * BN + o_n[None, :]), M, 4, BN)
    o_r = tl.arange(0, M // 4)
    tl.store(y + o_r[:, None] * BN + o_n[None, :], r)


@pytest.mark.parametrize(("M", "BN"), [(16, 16), (16, 64), (32, 32)])
def test_sum_streams_adds_the_streams_in_stream_order(M, BN):
    """Row r's streams r*4 .. r*4+3 added as ((s0 + s1) + s2) + s3, bit for bit, for any tile shape; values of
    mixed magnitude, so another order would round differently."""
    g = torch.Generator().manual_seed(M + BN)
    a = torch.randn(M, BN, generator=g) * torch.tensor([1e8, 1.0, -1e8, 1e-3]).repeat(M // 4)[:, None]
    y = torch.full((M // 4, BN), float("nan"))
    _sum_streams_kernel[(1,)](a, y, M, BN)
    t = a.view(M // 4, 4, BN)
    assert torch.equal(y, ((t[:, 0] + t[:, 1]) + t[:, 2]) + t[:, 3])
    assert not torch.equal(y, ((t[:, 0] + t[:, 2]) + t[:, 1]) + t[:, 3])  # the order shows in the bits


def test_norm_auto_folds_while_the_stream_rows_fit_one_tile():
    """`norm` "auto": fold while rows x streams fit the 16-row tile rows alone need (rows <= 4 at 4 streams)."""
    from glm53ctl.kernels.gemv import folds

    assert [folds("auto", rows, 4) for rows in (1, 2, 4, 5, 8)] == [True, True, True, False, False]
    assert folds("fold", 8, 4) and not folds("task", 1, 4)


@triton.jit
def _preloaded_kernel(
    x, w, y, R, N, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRE: tl.constexpr, INTERPRET: tl.constexpr
):
    n0 = tl.program_id(0) * BN
    if PRE == 0:
        acc = gemv_tile(x, K, w, n0, R, N, K, K, BN, BK, INTERPRET)
    else:  # as dense's o_proj / down tasks with knob preload: PRE tiles first, then the rest of the K loop
        tiles = load_w_tiles(w, n0, N, K, BN, BK, PRE)
        acc = mma_w_tiles(tiles, x, K, R, BN, BK, PRE, INTERPRET)
        acc = gemv_tile_acc(acc, x + PRE * BK, K, w + PRE * BK, n0, R, N, K - PRE * BK, K, BN, BK, INTERPRET)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    tl.store(y + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


@pytest.mark.parametrize("pre", [1, 3, 6])
def test_preloaded_k_tiles_keep_gemv_tiles_bits(pre):
    """Knob `preload`'s GEMV: some or all K tiles loaded as register tiles, then the rest of the K loop, gives
    gemv_tile's bits (a ragged last output tile too); the knob's KiB become whole K tiles of the slice."""
    R, N, K, BN, BK = 3, 40, 192, 16, 32
    g = torch.Generator().manual_seed(pre)
    x = torch.randn(R, K, generator=g).to(torch.bfloat16)
    w = (torch.randn(N, K, generator=g) * torch.logspace(-3, 3, K)).to(torch.bfloat16)
    ys = []
    for p in (0, pre):
        ys.append(torch.full((R, N), float("nan")))
        _preloaded_kernel[(triton.cdiv(N, BN),)](x, w, ys[-1], R, N, K, BN, BK, p, interpreting())
    assert torch.equal(ys[0], ys[1])
    assert torch.allclose(ys[1], x.float() @ w.float().T, rtol=1e-5, atol=1e-3)
    assert [preloaded_tiles(kib, 32, 128, 768) for kib in (0, 16, 32, 48, 64)] == [0, 2, 4, 6, 6]
