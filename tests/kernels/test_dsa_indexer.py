"""The indexer's bodies (kernels/ops/dsa/indexer.py) against the reference's, in the interpreter: the key's
LayerNorm, a completed pool's key, and the index scores of rows with different numbers of pools; the scores feed
the selection (select.py) to the reference's selection."""

import pytest
import torch
import torch.nn.functional as F

from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.ops.dsa.indexer import layer_norm_launch, pool_launch, scores_launch
from glm53ctl.kernels.ops.dsa.naive import index_scores, pool_key, select_token_rows
from glm53ctl.kernels.ops.dsa.select import select_launch
from glm53ctl.kernels.spec import load_model

pytestmark = pytest.mark.interpreter


def test_layer_norm():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 16, generator=g) * 3 + 1
    w, b = (torch.randn(16, generator=g).to(torch.bfloat16) for _ in range(2))
    want = F.layer_norm(x, (16,), w.float(), b.float(), 1e-6)
    assert rel_rms(want, layer_norm_launch(x, w, b, 1e-6)) < 1e-6


def test_pool_key():
    g = torch.Generator().manual_seed(1)
    keys, gates = (torch.randn(5, 4, 16, generator=g).to(torch.bfloat16) for _ in range(2))
    ape = torch.randn(4, 16, generator=g)
    want = pool_key(keys.float(), gates.float(), ape)
    assert rel_rms(want, pool_launch(keys, gates, ape).float()) < 4e-3  # one bf16 rounding


@pytest.mark.parametrize("model", ["tiny", "glm53_flash"])
def test_scores_and_the_selection_they_make(model):
    """Rows with 1, 9 and 40 pools (tiny: 8 are selected); glm53_flash's 32 heads of 128 over 700 pools."""
    spec = load_model(model)
    ix = spec.indexer
    g = torch.Generator().manual_seed(2)
    P = torch.tensor([1, 9, 40]) if model == "tiny" else torch.tensor([700, 3])
    R, Pm = len(P), int(P.max())
    qi = torch.randn(R, ix.heads, ix.head_dim, generator=g)
    w = torch.randn(R, ix.heads, generator=g) * ix.heads**-0.5
    pooled = torch.randn(R, Pm, ix.head_dim, generator=g).to(torch.bfloat16)
    got = scores_launch(qi, w, pooled, P, spec, block=64)
    want = index_scores(qi, w, pooled.float(), spec)
    for r in range(R):
        p = int(P[r])
        assert rel_rms(want[r, :p], got[r, :p]) < 1e-5
    n = P * ix.kpool + torch.tensor([1, 3, 0][:R])
    assert torch.equal(select_launch(got, n, spec).long(), select_token_rows(want, n, spec))
