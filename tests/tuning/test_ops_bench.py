"""`bench --op`: an op's body alone (tuning/ops_bench.py). What it launches is checked here against the reference
in the interpreter, at tiny's sizes, twice over the same buffers (a CUDA graph replays it so); the timing needs a
GPU (tests/gpu and `glm53ctl bench --op` there)."""

import pytest
import torch

from glm53ctl.kernels.numerics import FP32, rel_rms
from glm53ctl.kernels.ops.dsa.naive import index_scores, select_token_rows, sparse_mla
from glm53ctl.kernels.ops.ffn.naive import topk_ordered
from glm53ctl.kernels.ops.mhc import naive as mhc_naive
from glm53ctl.kernels.spec import load_model
from glm53ctl.tuning.ops_bench import OPS
from tests.kernels.test_kda_kernel import reference as kda_reference

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("op", ["select", "select3", "select0"])
@pytest.mark.parametrize("pools", [3, 16, 40])
def test_the_selection_alone_is_the_references_at_every_call(pools, op):
    spec = load_model("tiny")
    run = OPS[op].make(spec, pools, "cpu")
    g = torch.Generator().manual_seed(pools)
    scores = torch.randn(1, pools, generator=g)  # what make draws
    want = select_token_rows(scores, torch.tensor([pools * spec.indexer.kpool]), spec).to(torch.int32)
    for _ in range(2):
        assert torch.equal(run(), want)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_routing_alone_is_the_references_at_every_call(rows):
    spec = load_model("tiny")
    run = OPS["route"].make(spec, rows, "cpu")
    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(4, 16, spec.moe.experts, generator=g)
    bias = 0.1 * torch.randn(spec.moe.experts, generator=g)
    s = torch.sigmoid(logits.sum(0)[:rows])
    want = topk_ordered(s + bias, spec.moe.top_k).sort(dim=-1).values
    chosen = s.gather(1, want)
    weights = chosen / (chosen.sum(-1, keepdim=True) + 1e-20) * spec.moe.routed_scaling_factor
    for _ in range(2):
        ids, w, _ = run()
        order = ids.long().sort(dim=-1)
        assert torch.equal(order.values, want)
        assert torch.allclose(w.gather(1, order.indices), weights, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("heads", [2, 8])
def test_the_kda_head_alone_is_the_references_at_every_call(heads):
    spec = load_model("tiny")
    run = OPS["kda_head"].make(spec, heads, "cpu")
    rz, rconv, rS = kda_reference(*run.inputs, spec)
    for _ in range(2):
        z, conv, S = run()
        assert rel_rms(rS, S) < 1e-5 and rel_rms(rz, z.float()) < 1e-2 and torch.equal(conv.float(), rconv)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_gate_alone_is_the_references_at_every_call(rows):
    spec = load_model("tiny")
    run = OPS["gate"].make(spec, rows, "cpu")
    H, *args = run.inputs
    ref_x, ref_post, ref_comb = mhc_naive.gate(H.float(), *args, spec, FP32)
    for _ in range(2):
        x_hat, post, comb = run()
        assert rel_rms(ref_post, post) < 1e-5 and rel_rms(ref_comb, comb) < 1e-5
        assert rel_rms(ref_x, x_hat.float()) < 1e-2


@pytest.mark.parametrize("pools", [3, 70])
def test_the_scores_alone_are_the_references_at_every_call(pools):
    spec = load_model("tiny")
    run = OPS["scores"].make(spec, pools, "cpu")
    qi, w, pooled, _ = run.inputs
    want = index_scores(qi, w, pooled.float(), spec)
    for _ in range(2):
        assert rel_rms(want, run()) < 1e-5


@pytest.mark.parametrize("heads", [1, 4])
def test_the_mla_attention_alone_is_the_references_at_every_call(heads):
    spec = load_model("tiny")
    run = OPS["mla_attention"].make(spec, heads, "cpu")
    q, latent, idx, scale = run.inputs
    assert idx.shape == (1, spec.index_width) and bool((idx >= 0).all())  # every selected token valid
    want = sparse_mla(q.float(), latent.float(), idx.long(), scale)
    for _ in range(2):
        assert rel_rms(want, run().float()) < 1e-2
