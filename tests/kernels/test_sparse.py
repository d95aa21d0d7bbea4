"""The `sparse` launch (a DSA layer: MLA with the k-pool indexer, then the MoE) under TRITON_INTERPRET=1 on `tiny`:
every output and cache write against the reference at every TP x rows key, rows at contexts below and above the
selection width in one launch; tied index scores selected by pool index; bitwise equal across schedule knobs and
the separate launches; every MLA site stuck is named."""

import pytest
import torch

from glm53ctl.kernels.checks import fault_key
from glm53ctl.kernels.kinds import CPU_KEYS, get_kind
from glm53ctl.kernels.kinds.sparse.harness import SparseHarness
from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.ops.dsa import tasks as dsa
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import ROOT, Weights
from tests.helpers import assert_same_bits, assert_separate_launches_keep_bits, first_site_of_each, resolved

BOUNDS = get_kind("sparse").bounds
MLA_TYPES = tuple(getattr(dsa, t).value for t in "MLA_A MLA_ROW MLA_QB ABSORB SCORE SELECT ATTN COMBINE WUV".split())

pytestmark = pytest.mark.interpreter
# keys besides the CPU keys (every TP width and row count once there): each TP and each row count once more
KEYS = [(1, 8), (2, 1), (4, 4), (8, 2)]
assert not set(KEYS) & set(CPU_KEYS)


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=5)


def _check(k: SparseHarness, seed: int) -> dict:
    x = k.inputs(seed=seed)[0]
    out = k(x, poison=True)
    k.follow = {n: out[n] for n in k.FOLLOWED if n in out}  # as `check`: near-ties in a top-k go the launch's way
    ref = k.reference(x)
    for name, bound in BOUNDS.items():
        err = rel_rms(ref[name], out[name])
        assert err <= bound, (name, err)  # NaN fails here too
    bad = [name for name, holds in k.invariants(out, ref).items() if not holds]
    assert not bad, bad
    return out


# with the main job's CPU keys (`check`, tests/cli/test_check.py) every TP width and row count twice; the whole
# matrix is `glm53ctl check --kind kda,sparse --all-keys`, by hand (2026-12-04: 32 of 32 pass, 5 min 24 s on 2 cores)
@pytest.mark.parametrize(("tp", "rows"), KEYS)
def test_against_the_reference(weights, tp, rows):
    """Every output and cache write within its bound, the selection and the routing exactly the reference's, at
    keys besides the CPU keys, where `glm53ctl check` proves the same and more (tests/cli/test_check.py); rows 2
    and more mix contexts below and above the selection width."""
    k = SparseHarness(weights, resolved("sparse", tp, rows, {"grid": 3}))
    w = load_model("tiny").index_width
    if rows > 1:
        assert min(k.contexts) < w < max(k.contexts)
    _check(k, seed=100 * tp + rows)


def test_tied_index_scores_take_the_lower_pools():
    """The indexer's query weights zero: every pool scores 0, and rows past the width take the first pools (and the
    tail), as the reference's stable order."""
    spec = load_model("tiny")
    pre = f"{ROOT}layers.3.self_attn.indexer."
    ix = spec.indexer
    loaded = {pre + "wq_b.weight": torch.zeros(ix.heads * ix.head_dim, spec.mla.q_lora_rank)}
    k = SparseHarness(Weights(spec, seed=5, loaded=loaded), resolved("sparse", 2, 2))
    out = _check(k, seed=7)
    n = max(k.contexts) + 1
    row = k.contexts.index(max(k.contexts))
    first = torch.arange(spec.index_pools * ix.kpool)
    assert torch.equal(out["dsa.idx"][row, : len(first)].long(), first)
    tail = torch.arange(n // ix.kpool * ix.kpool, n)
    assert torch.equal(out["dsa.idx"][row, len(first) : len(first) + len(tail)].long(), tail)


@pytest.mark.parametrize(
    "knobs",
    [
        {"box_words": 16, "handoff": "flag"},
        {"block_n_down": 16, "block_n_in": 16},
        {"weights_first": 1},
        {"route": "each", "launch": "stages"},
        {"launch": "stages", "grid": 64},
        {"down_stage": "gate_up", "route": "each", "launch": "stages"},
        {"launch": "stages", "stage_code": "own"},
        {"select_passes": 3},
        {"select_passes": 1, "route": "each"},
        {"select_passes": 0, "launch": "stages", "grid": 64},
    ],
)
def test_schedule_knobs_keep_every_bit(weights, knobs):
    k = SparseHarness(weights, resolved("sparse", 2, 2))
    x = k.inputs(seed=9)[0]
    peers = k.peer_partials(x)
    base = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    assert_same_bits(base, SparseHarness(weights, resolved("sparse", 2, 2, knobs))(x, peers, poison=True), str(knobs))


def test_token_block_is_accurate(weights):
    """token_block (numeric): 32 tokens per attention task instead of 64, within the bounds."""
    _check(SparseHarness(weights, resolved("sparse", 2, 2, {"token_block": 32})), seed=13)


def test_separate_launches_keep_every_bit(weights):
    assert_separate_launches_keep_bits(SparseHarness(weights, resolved("sparse", 4, 2)))


def test_the_mla_sites_stuck_are_named(weights):
    """A site of each MLA task type stuck: LaunchFault names it and the retried launch is a clean one's bits."""
    k = SparseHarness(weights, resolved("sparse", 2, 1))
    t = k.launch.table
    sites = first_site_of_each(t, MLA_TYPES)
    for s in sites.values():
        res = fault_key(weights, resolved("sparse", 2, 1), s, budget_ns=10**6, wall_s=60)
        assert res.ok and res.named == 1 and res.retries_equal == 1, res.problems


def test_select_passes_drop_the_passes_and_the_takes_site_is_named(weights):
    """knob select_passes: with 2 passes, each part's take waits on every part's second pass; with none, on every
    score task of its row, and no pass is a task; within the bounds against the reference at contexts below and
    above the selection width (rows 4); the take's site stuck is named and the retried launch is a clean one's
    bits."""
    for passes, producer in ((2, dsa.SEL_PASS.value), (0, dsa.SCORE.value)):
        k = SparseHarness(weights, resolved("sparse", 1, 4, {"select_passes": passes}))
        t = k.launch.table
        types = [task[0] for task in t.tasks]
        assert types.count(dsa.SEL_PASS.value) == 4 * passes * k.launch.d.SEL.NQ_ROW
        for i in (i for i, ty in enumerate(types) if ty == dsa.SELECT.value):
            (site,) = t.sites_of(i)
            assert {types[p] for p in site.producers} == {producer}
            if passes:
                assert {t.tasks[p][2] for p in site.producers} == {passes - 1}  # the step field: the last pass
        _check(k, seed=17)
    key = resolved("sparse", 2, 1, {"select_passes": 0})
    t = SparseHarness(weights, key).launch.table
    site = t.first_site[next(i for i, task in enumerate(t.tasks) if task[0] == dsa.SELECT.value)]
    res = fault_key(weights, key, site, budget_ns=10**6, wall_s=60)
    assert res.ok and res.named == 1 and res.retries_equal == 1, res.problems
