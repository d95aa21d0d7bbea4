"""One DSA layer's attention part as plain launches (kernels/ops/dsa/kernel.py `dsa_launch`) against the
reference's `dsa_attention` on tiny, in the interpreter: rows at contexts below and above the selection width in
one launch, steps that complete a pool, every cache write at the row's position, and TP ranks."""

import pytest
import torch

from glm53ctl.kernels.numerics import FP32, rel_rms
from glm53ctl.kernels.ops.dsa.kernel import dsa_launch
from glm53ctl.kernels.ops.dsa.naive import dsa_attention
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.state import DsaCache
from glm53ctl.kernels.weights import Weights

pytestmark = pytest.mark.interpreter


@pytest.fixture(scope="module")
def tiny():
    spec = load_model("tiny")
    return spec, Weights(spec, seed=4)


def _cache(spec, R: int, L: int, seed: int) -> DsaCache:
    g = torch.Generator().manual_seed(seed)
    m, ix = spec.mla, spec.indexer
    r = lambda *s: (torch.randn(*s, generator=g) * 0.5).to(torch.bfloat16)  # noqa: E731
    return DsaCache(
        r(R, L, m.kv_lora_rank), r(R, L, ix.head_dim), r(R, L, ix.head_dim), r(R, L // ix.kpool, ix.head_dim)
    )


@pytest.mark.parametrize(("tp", "rank", "pos"), [(1, 0, [0, 3, 34, 35]), (2, 1, [7, 60]), (8, 3, [35, 11, 2])])
def test_against_the_reference(tiny, tp, rank, pos):
    spec, weights = tiny
    layer = next(i for i in range(spec.model.num_layers) if spec.layer_type(i) == "dsa")
    w = weights.layer(layer, rank, tp).sub("self_attn.")
    R = len(pos)
    g = torch.Generator().manual_seed(sum(pos) + tp)
    x = torch.randn(R, spec.hidden, generator=g).to(torch.bfloat16)
    cache = _cache(spec, R, 64, seed=tp)
    p = torch.tensor(pos)
    got = dsa_launch(x, w, cache, p, spec)
    want = dsa_attention(x.float(), w, cache, p, spec, FP32)
    assert torch.equal(got.idx, want.idx)
    assert rel_rms(want.out, got.out) < 2e-2
    rows = torch.arange(R)
    for name in ("latent", "index_key", "index_gate"):
        a, b = getattr(got.cache, name), getattr(want.cache, name)
        assert rel_rms(b[rows, p].float(), a[rows, p].float()) < 1e-2, name
        other = torch.ones_like(a, dtype=torch.bool)
        other[rows, p] = False
        assert torch.equal(a[other], getattr(cache, name)[other]), f"{name}: only the rows' positions written"
    done = (p + 1) % spec.indexer.kpool == 0
    pk = (p + 1) // spec.indexer.kpool - 1
    if done.any():
        a, b = got.cache.pooled_key[rows[done], pk[done]], want.cache.pooled_key[rows[done], pk[done]]
        assert rel_rms(b.float(), a.float()) < 1e-2
