"""Sparse MLA in absorbed form (kernels/ops/dsa/attend.py) against the reference's `sparse_mla`, in the
interpreter: token blocks with log-sum-exp partials and their combine, rows at different contexts, -1 padding,
and blocks with no valid token."""

import pytest
import torch

from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.ops.dsa.attend import sparse_mla_launch
from glm53ctl.kernels.ops.dsa.naive import sparse_mla

pytestmark = pytest.mark.interpreter


def _case(R: int, H: int, C: int, L: int, W: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(R, H, C, generator=g).to(torch.bfloat16)
    lat = torch.randn(R, L, C, generator=g).to(torch.bfloat16)
    idx = torch.full((R, W), -1, dtype=torch.long)
    for r in range(R):
        n = [1, 5, W, W - 3][r % 4]  # a row's valid prefix: one token up to the full width
        idx[r, :n] = torch.randperm(L, generator=g)[:n].sort().values
    return q, lat, idx


@pytest.mark.parametrize(("R", "H", "token_block"), [(1, 8, 16), (3, 2, 8), (4, 20, 32)])
def test_against_the_reference(R, H, token_block):
    q, lat, idx = _case(R, H, 64, 80, 35, seed=R * 10 + H)
    got = sparse_mla_launch(q, lat, idx, 32**-0.5, token_block=token_block)
    want = sparse_mla(q.float(), lat.float(), idx, 32**-0.5)
    assert rel_rms(want, got.float()) < 1e-2


def test_blocks_with_no_token_change_nothing():
    """Token blocks of 8 over a width of 35 where a row selects one token: every block past the first is empty."""
    q, lat, idx = _case(4, 8, 64, 80, 35, seed=3)
    a = sparse_mla_launch(q, lat, idx, 0.2, token_block=8)
    want = sparse_mla(q.float(), lat.float(), idx, 0.2)
    assert rel_rms(want, a.float()) < 1e-2
    assert not torch.isnan(a.float()).any()


def test_the_combine_over_column_chunks_changes_no_bit():
    """The combine over latent column chunks of 16 and 32 (the layer's tasks split it so): the same bits as over
    the whole width in the interpreter, each column combined alone (a GPU build has one chunk width)."""
    q, lat, idx = _case(3, 8, 64, 80, 35, seed=4)
    whole = sparse_mla_launch(q, lat, idx, 0.2, token_block=8, combine_cols=64)
    for cols in (16, 32):
        assert torch.equal(sparse_mla_launch(q, lat, idx, 0.2, token_block=8, combine_cols=cols), whole)
