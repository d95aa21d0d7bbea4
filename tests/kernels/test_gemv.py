"""The GEMV helpers under TRITON_INTERPRET=1: the folded GEMV's stream sum adds the streams in stream order."""

import pytest
import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import sum_streams

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
    from glm53ctl.kernels.ops.gemv.kernel import folds

    assert [folds("auto", rows, 4) for rows in (1, 2, 4, 5, 8)] == [True, True, True, False, False]
    assert folds("fold", 8, 4) and not folds("task", 1, 4)
