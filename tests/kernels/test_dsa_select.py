"""The indexer's selection (kernels/ops/dsa/select.py) against the reference's `select_token_rows`, in the
interpreter, over parts of several sizes (its tokens are the same whatever the parts): contexts below and above the
selection width in one launch, exact ties (ReLU's zeros, -0.0 beside +0.0, repeated values) going to the lower pool
index, and glm53_flash's width at a 128K context."""

import pytest
import torch

from glm53ctl.kernels.ops.dsa.naive import select_token_rows
from glm53ctl.kernels.ops.dsa.select import LOCAL_POOLS, select_dims, select_launch
from glm53ctl.kernels.spec import load_model

pytestmark = pytest.mark.interpreter


def _check(scores: torch.Tensor, n: list[int], spec, parts: tuple[int, ...], passes=(4, 3, 2, 1, 0)) -> torch.Tensor:
    """The selection over parts of each size in `parts` (pools), with each number of `passes` as launches of their
    own (knob select_passes: the take finds the other digits over every key): the reference's tokens, whatever
    the parts and the passes."""
    nn = torch.tensor(n)
    want = select_token_rows(scores, nn, spec)
    for part in parts:
        for k in passes if part != 1 else (4, 0):  # a part a pool: many programs, each slow in the interpreter
            got = select_launch(scores, nn, spec, part=part, passes=k)
            assert torch.equal(got.long(), want), (part, k, got, want)
    return got


def test_contexts_below_and_above_the_width_in_one_launch():
    """tiny: 8 pools of 4 are selected (width 35): rows that take every pool and rows where the top-k selects."""
    spec = load_model("tiny")
    g = torch.Generator().manual_seed(0)
    n = [1, 3, 4, 17, 32, 33, 35, 36, 100, 257]
    scores = torch.randn(len(n), max(n) // 4 + 1, generator=g)
    _check(scores, n, spec, parts=(1, 16))


def test_exact_ties_go_to_the_lower_pool():
    """Scores as ReLU makes them: many exact zeros (some -0.0), and repeated values across the threshold."""
    spec = load_model("tiny")
    g = torch.Generator().manual_seed(1)
    P = 40
    base = torch.randint(0, 4, (6, P), generator=g).float() * 0.5  # values 0, 0.5, 1, 1.5: ties everywhere
    base[1] = 0.0  # every pool ties: the first 8 pools
    base[2, ::2] = -0.0  # -0.0 and +0.0 tie
    base[3] = -base[3]  # negative scores (a negative head weight)
    base[4, :10] = float("inf")
    _check(base, [P * 4, P * 4 - 1, P * 4, 4 * P - 2, 4 * P, 37], spec, parts=(2, 64))


def test_a_128k_context_at_glm53_flash_width():
    """512 pools of 32,768 (128K tokens) and of 1,000, with exact ties at the threshold across parts: over 32 parts
    of 1,024 pools (the layer's)."""
    spec = load_model("glm53_flash")
    g = torch.Generator().manual_seed(2)
    n = [131072, 4003, 2051, 2052]
    scores = torch.relu(torch.randn(len(n), 131072 // 4, generator=g))
    scores[0, 1000:3000] = scores[0, 999]  # a run of equal scores somewhere in the top
    got = _check(scores, n, spec, parts=(1024,))
    assert (got[0, :2048] >= 0).all() and (got[0, 2048:] == -1).all() and (got[2] >= 0).all()


def test_fewer_passes_at_glm53_flash_width():
    """knob select_passes: 1,024 pools (4K tokens) and 4,096 (16K, the most it takes) over the layer's parts, the
    take finding 1 to 4 digits itself over every key, with a run of equal scores across the threshold, rows below
    the width and one at its pools' end; past LOCAL_POOLS the passes stay 4."""
    spec = load_model("glm53_flash")
    g = torch.Generator().manual_seed(4)
    for pools, n in ((1024, [4096, 4003, 2051, 2052, 17]), (4096, [16384, 16001, 8193, 4096])):
        scores = torch.relu(torch.randn(len(n), pools, generator=g))
        scores[0, 100:900] = scores[0, 99]  # a run of equal scores across the threshold
        scores[1, ::7] = -0.0
        assert select_dims(pools, passes=1).PASSES == 1
        _check(scores, n, spec, parts=(None,), passes=(3, 1, 0))
    assert select_dims(LOCAL_POOLS * 2, passes=1).PASSES == 4


def test_the_stock_baselines_selection_is_the_references():
    """`bench`'s stock baseline selects on the device (a stable sort, no host round trip): the same tokens."""
    from glm53ctl.kernels.kinds.sparse.stock import select_on_device

    spec = load_model("tiny")
    g = torch.Generator().manual_seed(3)
    n = torch.tensor([1, 3, 4, 17, 35, 36, 100, 257])
    scores = torch.randint(0, 3, (len(n), 65), generator=g).float()  # ties everywhere
    assert torch.equal(select_on_device(scores, n, spec), select_token_rows(scores, n, spec))
