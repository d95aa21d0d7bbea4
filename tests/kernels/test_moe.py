"""The MoE bodies (kernels/ops/ffn/moe.py) against the reference's `moe` on tiny, in the interpreter: routing
decided on the device, ties by index, rows choosing the same and disjoint experts, the shared expert always on,
and the sum in the reference's order."""

import pytest
import torch

from glm53ctl.kernels.numerics import FP32, rel_rms
from glm53ctl.kernels.ops.ffn.moe import moe_launch
from glm53ctl.kernels.ops.ffn.naive import moe
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights

pytestmark = pytest.mark.interpreter
LAYER = 4  # a KDA layer with the MoE


@pytest.fixture(scope="module")
def tiny():
    spec = load_model("tiny")
    return spec, Weights(spec, seed=0)


def _weights(w: Weights, tp: int, rank: int) -> dict:
    mlp = w.layer(LAYER, rank, tp).sub("mlp.")
    return {name: mlp[name] for name in mlp}


def _x(rows: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, d, generator=g).to(torch.bfloat16)


def _check(spec, w: dict, x: torch.Tensor) -> dict:
    got = moe_launch(x, w, spec)
    out, ids, wts = moe(x.float(), w, spec, FP32)
    assert torch.equal(got["ids"].long(), ids), (got["ids"], ids)
    assert torch.allclose(got["weights"], wts, rtol=1e-6, atol=0)
    assert rel_rms(out, got["out"]) < 1e-2
    # the routing invariants check asks for: distinct experts in range, weights summing to the scale
    k, E = spec.moe.top_k, spec.moe.experts
    assert all(len(set(row.tolist())) == k for row in got["ids"]) and int(got["ids"].max()) < E
    assert torch.allclose(got["weights"].sum(-1), torch.full((x.shape[0],), spec.moe.routed_scaling_factor))
    union = sorted(set(got["ids"].flatten().tolist()))
    n = int(got["n_slots"][0])
    assert n == len(union) and got["slots"][:n].tolist() == union and (got["slots"][n:] == -1).all()
    return got


@pytest.mark.parametrize("tp, rank, rows", [(1, 0, 1), (2, 1, 2), (4, 0, 8), (8, 7, 3)])
def test_moe_matches_the_reference(tiny, tp, rank, rows):
    spec, w = tiny
    _check(spec, _weights(w, tp, rank), _x(rows, spec.hidden, 10 * tp + rows))


def test_exact_ties_go_to_the_lower_index(tiny):
    """Every score equal (router and bias zero): the top-k are experts 0..k-1, each weighted scale / k."""
    spec, w = tiny
    mw = _weights(w, 2, 0)
    mw["gate.weight"] = torch.zeros_like(mw["gate.weight"])
    mw["gate.e_score_correction_bias"] = torch.zeros_like(mw["gate.e_score_correction_bias"])
    got = _check(spec, mw, _x(3, spec.hidden, 5))
    k = spec.moe.top_k
    assert (got["ids"] == torch.arange(k, dtype=torch.int32)).all()
    assert torch.allclose(got["weights"], torch.full((3, k), spec.moe.routed_scaling_factor / k))


def test_rows_choosing_the_same_and_disjoint_experts(tiny):
    """Rows with the same x̂ choose the same experts (one slot per expert, read once); rows aligned with
    different router rows choose disjoint ones (one slot each)."""
    spec, w = tiny
    mw = _weights(w, 4, 1)
    k, E, D = spec.moe.top_k, spec.moe.experts, spec.hidden
    same = _check(spec, mw, _x(1, D, 7).repeat(4, 1))
    assert int(same["n_slots"][0]) == k
    # row r points along dimension r; experts r*k .. r*k+k-1 have a large router weight there
    router = torch.zeros(E, D)
    for e in range(E):
        router[e, e // k] = 4.0 + 0.01 * e
    mw["gate.weight"] = router.to(mw["gate.weight"].dtype)
    mw["gate.e_score_correction_bias"] = torch.zeros(E)
    x = torch.zeros(E // k, D)
    x[torch.arange(E // k), torch.arange(E // k)] = 1.0
    disjoint = _check(spec, mw, x.to(torch.bfloat16))
    assert int(disjoint["n_slots"][0]) == E
    assert disjoint["ids"].tolist() == [list(range(r * k, (r + 1) * k)) for r in range(E // k)]


def test_nan_scores_never_choose_an_expert_out_of_range(tiny):
    """A router gone NaN: the routing is meaningless, but every id is a real expert, distinct: nothing downstream
    can index past the experts' weights (a graph that read freed memory once routed to ids past E and faulted)."""
    spec, w = tiny
    mw = _weights(w, 2, 0)
    mw["gate.weight"] = torch.full_like(mw["gate.weight"], float("nan"))
    got = moe_launch(_x(3, spec.hidden, 4), mw, spec)
    ids, E = got["ids"], spec.moe.experts
    assert int(ids.min()) >= 0 and int(ids.max()) < E
    assert all(len(set(row.tolist())) == spec.moe.top_k for row in ids)
    n = int(got["n_slots"][0])
    assert (got["slots"][:n] < E).all() and (got["slots"][:n] >= 0).all()


def test_the_reference_follows_a_launchs_routing_only_at_a_near_tie():
    """`check` hands the launch's expert ids to the reference: taken for a row where they score within ROUTE_TIE
    of the reference's own top-k (a bf16 hand-off may tip a near-tie either way), never past it."""
    from glm53ctl.kernels.ops.ffn.naive import ROUTE_TIE, near_tie

    s = torch.tensor([[0.9, 0.5, 0.5 - ROUTE_TIE / 2, 0.1], [0.9, 0.5, 0.5 - 3 * ROUTE_TIE, 0.1]])
    own = torch.tensor([[0, 1], [0, 1]])
    theirs = torch.tensor([[0, 2], [0, 2]])
    tol = torch.full((2,), ROUTE_TIE)
    assert near_tie(s, own, theirs, tol).tolist() == [True, False]
    assert not near_tie(s, own, torch.tensor([[0, 0], [0, 4]]), tol).any()  # repeated, out of range


def test_a_near_tie_never_drops_a_clearly_better_choice():
    """Taking the (k+1)-th for the k-th is a tie; dropping the best for the (k+1)-th is not, however close the
    k-th and the (k+1)-th are."""
    from glm53ctl.kernels.ops.ffn.naive import near_tie

    s = torch.tensor([[0.90, 0.50, 0.40, 0.300, 0.2995, 0.1]] * 2)
    own = torch.tensor([[0, 1, 2, 3]] * 2)
    theirs = torch.tensor([[0, 1, 2, 4], [1, 2, 3, 4]])
    assert near_tie(s, own, theirs, torch.full((2,), 1e-3)).tolist() == [True, False]


def test_keys_below_zero_choose_as_the_reference(tiny):
    """A bias below every score (keys s + bias < 0): the top-k as the reference's, no lane past the experts
    ranked above a real one (tiny's 16 experts are ranked against lanes of 64)."""
    spec, w = tiny
    mw = _weights(w, 2, 1)
    E = spec.moe.experts
    mw["gate.e_score_correction_bias"] = -10.0 - 0.01 * torch.arange(E, dtype=torch.float32)
    _check(spec, mw, _x(4, spec.hidden, 6))
