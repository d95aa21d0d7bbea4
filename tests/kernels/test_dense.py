"""The `dense` launch (a KDA layer with the dense MLP) under TRITON_INTERPRET=1 on `tiny`: every output and
every state write against the reference, bitwise equality across grids and every schedule knob, repeated
launches with no host reset, every wait site stuck in turn, and the separate-launches baseline."""

import pytest
import torch

from glm53ctl.kernels.checks import fault_key
from glm53ctl.kernels.kinds import get_kind
from glm53ctl.kernels.kinds.dense.harness import DenseHarness
from glm53ctl.kernels.kinds.harness import RunKey
from glm53ctl.kernels.kinds.layer.table import STAGES, k_slices
from glm53ctl.kernels.kinds.run_key import run_reference, run_triton
from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.ops.ffn.tasks import DOWN, GU
from glm53ctl.kernels.ops.gemv.kernel import folds
from glm53ctl.kernels.ops.gemv.tasks import OPROJ
from glm53ctl.kernels.ops.kda.tasks import INPROJ, KDA_HEAD
from glm53ctl.kernels.ops.mhc.tasks import COMB_A, COMB_F, GATE_A, GATE_F, MIX_A, MIX_F, RED_A, RED_F
from glm53ctl.kernels.reference import Reference
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.tuning.knobs import kind_knobs
from tests.helpers import assert_same_bits, bits, resolved

BOUNDS = get_kind("dense").bounds
# the task types as the table's rows hold them (ints)
GATE_A, GATE_F, GU, INPROJ, KDA_HEAD, OPROJ = (t.value for t in (GATE_A, GATE_F, GU, INPROJ, KDA_HEAD, OPROJ))
COMB_A, COMB_F, MIX_A, MIX_F, RED_A, RED_F = (t.value for t in (COMB_A, COMB_F, MIX_A, MIX_F, RED_A, RED_F))


pytestmark = pytest.mark.interpreter


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=5)


def assert_accurate(weights, k, x, out) -> None:
    ref = k.reference(x)
    for name, bound in BOUNDS.items():
        err = rel_rms(ref[name], out[name])
        assert err <= bound, (name, err)  # NaN fails here too


@pytest.mark.parametrize(("tp", "rows"), [(1, 8), (2, 4), (8, 1)])  # TP4 rows 2: the main job's (`check`)
def test_against_the_reference(weights, tp, rows):
    """Every output and write within its bound (every TP x rows key: `glm53ctl check`, in tests/cli)."""
    k = DenseHarness(weights, resolved("dense", tp, rows, {"grid": 3}))
    x = k.inputs(seed=100 * tp + rows)[0]  # fresh H and state per key
    assert_accurate(weights, k, x, k(x, poison=True))


# schedule knobs the interpreter cannot tell apart: compile options (stages, maxnreg) and what only the GPU's
# inline asm does (poll: the kind of load; prefetch). Their bits are checked on the GPU (tests/gpu).
GPU_ONLY = ("stages", "maxnreg", "poll", "prefetch")


def _variants():
    """Every schedule knob of dense at every value but its default, and grids 1, 2 and 7."""
    out = [("grid", g) for g in (1, 2, 7)]
    for knob in kind_knobs("dense").values():
        if knob.cls == "schedule" and knob.name not in ("grid", *GPU_ONLY):
            out += [(knob.name, v) for v in knob.values if v != knob.default]
    return out


@pytest.mark.parametrize(
    ("tp", "rows", "base", "knobs"),
    [(2, 3, {}, None), (4, 2, {"ksplit": 2}, ("grid", "oproj_first", "block_n_out", "handoff"))],
)
def test_schedule_knobs_are_bitwise_equal(weights, tp, rows, base, knobs):
    """Each value of each schedule knob gives the default's bits (ksplit, a numeric knob: its own baseline).
    The peers' partials are the default's: what is compared is rank 0's whole launch under the knob."""
    k = DenseHarness(weights, resolved("dense", tp, rows, {"grid": 4, **base}))
    x = k.inputs(seed=3)[0]
    peers = k.peer_partials(x)
    ref = k(x, peers, poison=True)
    assert_accurate(weights, k, x, ref)
    for name, value in _variants():
        if knobs is None or name in knobs:
            other = DenseHarness(weights, resolved("dense", tp, rows, {"grid": 4, **base, name: value}))
            assert_same_bits(ref, other(x, peers, poison=True), f"{name}={value}")


@pytest.mark.parametrize("ksplit", [2, 4])
def test_ksplit_is_numeric_and_accurate(weights, ksplit):
    k = DenseHarness(weights, resolved("dense", 2, 2, {"ksplit": ksplit}))
    assert k.launch.d.KS_O == k_slices(ksplit, k.launch.d.P) > 1
    x = k.inputs(seed=9)[0]
    assert_accurate(weights, k, x, k(x, poison=True))
    # o_proj tiles of a K slice wait only on the heads of that slice
    t = k.launch.table
    first = next(i for i, task in enumerate(t.tasks) if task[0] == OPROJ)
    waited = {p for s in t.sites if s.task == first for p in s.producers}
    heads = {t.tasks[p][1] for p in waited}
    assert all(t.tasks[p][0] == KDA_HEAD for p in waited) and heads == set(range(k.launch.d.HL // k.launch.d.KS_O))


@pytest.mark.parametrize(("ksplit_gu", "ksplit_in", "norm"), [(2, 1, "fold"), (4, 2, "task"), (1, 4, "fold")])
def test_k_slices_are_accurate_and_keep_their_bits(weights, ksplit_gu, ksplit_in, norm):
    """ksplit_gu and ksplit_in (numeric): gate/up and the in-projection over K slices, slice 0 adding them in
    order after a late wait: accurate, the same bits for other grids and hand-offs and as separate launches,
    and slice 0 waits late on the tile's other slices (and, folded, on its gates)."""
    knobs = {"ksplit_gu": ksplit_gu, "ksplit_in": ksplit_in, "norm": norm}
    k = DenseHarness(weights, resolved("dense", 2, 3, {**knobs, "grid": 3}))
    assert (k.launch.d.KS_GU, k.launch.d.KS_IN) == (ksplit_gu, ksplit_in)
    x = k.inputs(seed=11)[0]
    peers = k.peer_partials(x)
    out = k(x, peers, poison=True)
    assert_accurate(weights, k, x, out)
    other = DenseHarness(weights, resolved("dense", 2, 3, {**knobs, "grid": 7, "handoff": "flag"}))
    assert_same_bits(out, other(x, peers, poison=True), "grid 7, flags")
    assert_same_bits(out, k.separate()(x, peers, poison=True), "separate")
    t = k.launch.table
    for ttype, slices, gate in ((GU, ksplit_gu, GATE_F), (INPROJ, ksplit_in, GATE_A)):
        tiles = [i for i, task in enumerate(t.tasks) if task[0] == ttype]
        first = next(i for i in tiles if t.tasks[i][2] == 0)
        late = {t.tasks[p][0] for s in t.sites if s.task == first and s.late for p in s.producers}
        assert late == ({ttype} if slices > 1 else set()) | ({gate} if norm == "fold" else set())
        assert len(tiles) % slices == 0 and {t.tasks[i][2] for i in tiles} == set(range(slices))


@pytest.mark.parametrize(
    "knobs",
    [{}, {"norm": "task", "ksplit_in": 2, "kda_split": 2}, {"ksplit_gu": 4, "kda_split": 4, "ffn_mix": "task"}],
)
@pytest.mark.parametrize(("tp", "rows"), [(1, 2), (4, 3)])
def test_every_split_task_waits_on_exactly_its_parts(tp, rows, knobs):
    """The interpreter runs tasks in table order, so a wait left out could not fail a launch test: the table's
    waits are checked here, producer by producer. A KDA part waits early on its head's in-projection tiles; an
    o_proj tile on every part of every head (all rows) of its K slice, the parts making no z; a gate/up or
    in-projection tile's slice 0 late on exactly its other slices (and, folded, every row's gate chunk 0 of its
    side: the chunk that makes pre and 1/RMS); the
    other slices wait early on what they read, and late on nothing. The FFN gate and comb wait on their row's
    mix logits: the attention reduces, or (`mix_tasks`) the mix tasks, each on its chunk's reduce alone."""
    from glm53ctl.kernels.kinds.layer.table import Dims, build_table, kda_parts, mix_tasks

    k = get_kind("dense").record(**knobs)
    d = Dims(load_model("tiny"), tp, k)
    t = build_table(d, rows, k)
    fold = folds(k.norm, rows, load_model("tiny").mhc.streams)
    of_type = lambda ttype: {i for i, task in enumerate(t.tasks) if task[0] == ttype}  # noqa: E731
    for i, (ttype, a0, a1, _) in enumerate(t.tasks):
        sites = [s for s in t.sites if s.task == i]
        early = {p for s in sites if not s.late for p in s.producers}
        late = {p for s in sites if s.late for p in s.producers}
        assert all(p < i for p in early | late)
        if ttype == KDA_HEAD:
            assert early and all(t.tasks[p][0] == INPROJ and t.tasks[p][2] == 0 for p in early) and not late
        elif ttype == OPROJ:
            heads = range(a1 * d.PK // d.K, (a1 + 1) * d.PK // d.K)
            assert early == {j for j in of_type(KDA_HEAD) if t.tasks[j][1] in heads} and not late
            assert len(early) == len(heads) * rows * kda_parts(k["kda_split"], d.HL, rows, k["grid"])
        elif ttype in (GU, INPROJ):
            slices = {j for j, task in enumerate(t.tasks) if task[:2] == (ttype, a0)} - {i}
            gates = of_type(GATE_F if ttype == GU else GATE_A)
            expect_early = (of_type(RED_A) if ttype == GU else set()) if fold else gates
            assert early == expect_early
            heads = {j for j in gates if t.tasks[j][2] == 0}  # each row's gate chunk 0: pre and 1/RMS
            assert late == ((slices | (heads if fold else set())) if a1 == 0 else set())
        elif ttype in (GATE_A, COMB_A):
            assert early == {j for j in of_type(MIX_A) if t.tasks[j][2] == a0} and not late
        elif ttype in (GATE_F, COMB_F):
            mixer = MIX_F if mix_tasks(k, rows, load_model("tiny").mhc.streams) else RED_A
            assert early == {j for j in of_type(mixer) if t.tasks[j][2] == a0} and not late
        elif ttype == MIX_F:
            assert [t.tasks[p][:3] for p in early] == [(RED_A, a0, a1)] and not late
        elif ttype in (RED_A, RED_F):  # hc_post's comb: no other path leads from the Sinkhorn task to the reduce
            comb = COMB_A if ttype == RED_A else COMB_F
            assert {j for j in of_type(comb) if t.tasks[j][1] == a1} <= early and not late
        else:
            assert not late


def test_ffn_mix_auto_makes_mix_tasks_where_gate_up_folds():
    """ffn_mix "auto": mix tasks exactly where gate/up folds the norm (waiting for H1 alone, it starts sooner);
    unfolded, gate/up waits for the FFN gates and a mix task would add a hand-off before them."""
    from glm53ctl.kernels.kinds.layer.table import mix_tasks

    k = get_kind("dense").record
    auto = [mix_tasks(k(ffn_mix="auto", norm="auto"), rows, 4) for rows in (1, 2, 4, 5, 8)]
    assert auto == [True, True, True, False, False]
    assert not mix_tasks(k(ffn_mix="auto", norm="task"), 1, 4)
    assert mix_tasks(k(ffn_mix="task", norm="task"), 8, 4) and not mix_tasks(k(ffn_mix="reduce", norm="fold"), 1, 4)


def test_kda_split_0_splits_heads_as_far_as_the_grid_covers_their_parts():
    """kda_split 0 at glm53_flash's keys on an H200's 396 programs: the parts that measured fastest of 1, 2, 4
    (docs/perf/dense.md); a value given is kept."""
    from glm53ctl.kernels.kinds.layer.table import Dims, kda_parts

    spec = load_model("glm53_flash")
    heads = {tp: Dims(spec, tp, get_kind("dense").record()).HL for tp in (1, 2, 4, 8)}
    best = {(1, 1): 4, (1, 2): 2, (1, 4): 1, (1, 8): 1, (2, 2): 4, (2, 4): 2, (2, 8): 1, (4, 1): 4, (4, 4): 4}
    best |= {(4, 8): 2, (8, 1): 4, (8, 8): 4}
    assert {key: kda_parts(0, heads[key[0]], key[1], 396) for key in best} == best
    assert kda_parts(2, heads[1], 8, 396) == 2 and kda_parts(0, heads[8], 1, 4) == 1


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the table without its late waits reads poisoned buffers
@pytest.mark.parametrize(
    ("tp", "rows", "knobs"),
    [(2, 3, {}), (4, 2, {"norm": "task", "ksplit_in": 2, "kda_split": 2, "oproj_first": 1, "ksplit_gu": 4})],
)
def test_any_claim_order_the_waits_allow_gives_the_same_bits(weights, tp, rows, knobs):
    """The interpreter claims in table order, where a wait left out of the table is harmless. Claimed in random
    topological orders of the waits (Runtime.shuffle), with the hand-off buffers NaN-poisoned first, the launch
    gives the table order's bits; and a table without its late waits (a slice 0 on its slices, a folded GEMV on
    its gates) does not: the check can fail."""
    from unittest import mock

    from glm53ctl.kernels.runtime.table import TaskTable

    k = DenseHarness(weights, resolved("dense", tp, rows, {"grid": 3, **knobs}))
    x = k.inputs(seed=12)[0]
    peers = k.peer_partials(x)
    ref = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    n = k.launch.table.n_tasks
    for seed in (1, 2):
        assert k.launch.runtime.shuffle(seed) != list(range(n))
        assert_same_bits(ref, k(x, peers, poison=True), f"claim order {seed}")

    wait = TaskTable.wait

    def early_only(self, task, producers, mechanism="flag", words=32, late=False):
        if not late:
            wait(self, task, producers, mechanism, words)

    with mock.patch.object(TaskTable, "wait", early_only):
        bad = DenseHarness(weights, resolved("dense", tp, rows, {"grid": 3, **knobs}))
    assert not any(s.late for s in bad.launch.table.sites)
    assert_same_bits(ref, bad(x, peers, poison=True), "table order hides the missing waits")
    differs = 0
    for seed in range(3):
        bad.launch.runtime.shuffle(seed)
        out = bad(x, peers, poison=True)
        differs += any(not torch.equal(bits(ref[n]), bits(out[n])) for n in ref)
    assert differs > 0


def test_three_launches_in_a_row_without_host_reset(weights):
    k = DenseHarness(weights, resolved("dense", 4, 3, {"grid": 3}))
    x = k.inputs(seed=4)[0]
    peers = k.peer_partials(x)
    first = k(x, peers, poison=True)
    epoch = k.launch.runtime.epoch
    for _ in range(3):
        assert_same_bits(first, k(x, peers, poison=True), "a repeated launch")
    assert k.launch.runtime.epoch == epoch + 3


def test_each_site_stuck_is_named_and_the_retry_is_clean(weights):
    """Every site of TP8 rows 1 (43: early and late ones, the peers' site) stuck in turn. The retry starts
    from poisoned hand-off buffers (`LayerLaunch.poison`): a stuck KDA part leaves its head's arrival count
    partial, and a retry that counted it would make no z and fail here."""
    res = fault_key(weights, resolved("dense", 8, 1), None, budget_ns=10**6, wall_s=60)
    assert res.sites > 40 and res.ok, res.problems
    assert res.named == res.retries_equal == res.sites


def test_weights_first_waits_late_and_each_late_site_is_named(weights):
    """weights_first: o_proj's and down's sites are late (waited in their bodies, after their first weights), and
    gate/up and the in-projection wait for their early sites in their bodies; each stuck is named, and the retry
    is clean, as at the default."""
    key = resolved("dense", 2, 1, {"weights_first": 1})
    k = DenseHarness(weights, key)
    t = k.launch.table
    gemvs = [i for i, task in enumerate(t.tasks) if task[0] in (OPROJ, DOWN.value)]
    assert gemvs and all(s.late for i in gemvs for s in t.sites_of(i))
    # rows 8: gate/up unfolded (it waits for the FFN gates' x̂ in its body), the same bits as the default
    base = DenseHarness(weights, resolved("dense", 2, 8, {"grid": 5}))
    x = base.inputs(seed=4)[0]
    peers = base.peer_partials(x)
    first = DenseHarness(weights, resolved("dense", 2, 8, {"grid": 5, "weights_first": 1}))
    assert_same_bits(base(x, peers, poison=True), first(x, peers, poison=True), "weights_first at rows 8")
    for ttype in (OPROJ, DOWN.value, GU, INPROJ):  # the first site of each (every site at the default: above)
        site = next(i for i, s in enumerate(t.sites) if t.tasks[s.task][0] == ttype)
        res = fault_key(weights, key, site, budget_ns=10**6, wall_s=60)
        assert res.ok and res.named == res.retries_equal == res.sites == 1, res.problems


@pytest.mark.parametrize(("tp", "rows"), [(1, 1), (2, 3), (4, 8)])
def test_the_other_norm_value_is_accurate_and_keeps_its_bits(weights, tp, rows):
    """`norm` is numeric; the default ("auto") is checked above: folded at rows <= 4 (INPROJ and gate/up tasks
    stream H's R * HC stream rows against the weights ⊙ norm_w and wait for the gates' pre and 1/RMS at their
    end), not past them. Here the other value at each key: "task" (INPROJ waits for x̂) at rows <= 4, "fold" at
    rows 8 (32 stream rows, a 32-row tile): accurate, and its schedule knobs and separate launches keep its
    bits."""
    norm = "task" if folds("auto", rows, weights.spec.mhc.streams) else "fold"
    k = DenseHarness(weights, resolved("dense", tp, rows, {"grid": 3, "norm": norm}))
    assert k.launch.constexprs()["dims"].M == (32 if norm == "fold" else 16)
    x = k.inputs(seed=500 + 10 * tp + rows)[0]
    peers = k.peer_partials(x)
    out = k(x, peers, poison=True)
    assert_accurate(weights, k, x, out)
    other = DenseHarness(
        weights, resolved("dense", tp, rows, {"grid": 64, "norm": norm, "handoff": "flag", "block_n_in": 16})
    )
    assert_same_bits(out, other(x, peers, poison=True), "grid 64, flags, block_n_in 16")
    if (tp, rows) == (2, 3):
        assert_same_bits(out, k.separate()(x, peers, poison=True), "separate")


@pytest.mark.parametrize(("oproj_first", "kda_split"), [(0, 1), (1, 4)])
def test_separate_launches_give_the_same_bits(weights, oproj_first, kda_split):
    """The baseline a persistent launch must beat: one launch per stage, the same bodies and bits. A split KDA
    head's parts wait for nothing in the KDA stage's launch (the last part of a head to arrive makes z)."""
    k = DenseHarness(weights, resolved("dense", 2, 2, {"oproj_first": oproj_first, "kda_split": kda_split}))
    x = k.inputs(seed=6)[0]
    peers = k.peer_partials(x)
    whole = k(x, peers, poison=True)
    sep = k.separate()
    assert_same_bits(whole, sep(x, peers, poison=True), "separate launches")  # the outputs and the state writes
    # 10 launches that run every task of the whole launch exactly once
    stages, table = sep.launch.stages, k.launch.table
    assert len(stages) == 10 and sum(st.table.n_tasks for st in stages) == table.n_tasks
    assert sorted(t for st in stages for t in st.table.tasks) == sorted(table.tasks)
    kda = stages[STAGES.index((KDA_HEAD,))].runtime.table
    assert kda.n_tasks and not kda.sites


def test_run_backend_triton_matches_the_reference_over_steps(weights):
    key = RunKey("dense", 2, 2, context=5, steps=2, seed=1)
    ref = run_reference(Reference(weights, 2), key)
    out = run_triton(weights, key, resolved("dense", 2, 2))
    assert set(ref) == set(out)
    for name in ref:
        if name.startswith(("outputs.", "writes.", "inputs.state.")):  # step 2 reads step 1's writes
            bound = BOUNDS.get(name.removeprefix("outputs."), 1e-2)
            assert rel_rms(ref[name], out[name]) <= bound, name
        else:
            assert torch.equal(ref[name].float(), out[name].float()), name


def test_a_traced_launch_keeps_its_bits_and_records_every_task(weights):
    """The trace build (benchmarks' `--trace`) stamps each task's claim, ready and publish (the interpreter has
    no timer: it records the program only) and changes no output."""
    from glm53ctl.kernels.runtime.trace import format_summary, summarize

    k = DenseHarness(weights, resolved("dense", 2, 2, {"grid": 3}))
    x = k.inputs(seed=8)[0]
    peers = k.peer_partials(x)
    plain = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    k.launch.tracing = True
    tr = k.launch.buf["trace"]
    tr.fill_(-1)
    assert_same_bits(plain, k(x, peers, poison=True), "traced")
    assert set(tr[:, 3].tolist()) == {0, 1, 2}  # every task recorded, by each of the 3 programs
    # times made up (task i claimed at 10 i µs, ready 1 µs later, published 1 µs after that): the path runs
    # back from the last task through each step's latest producer to a task that waits on nothing
    n = k.launch.table.n_tasks
    made_up = torch.arange(n)[:, None] * 10_000 + torch.tensor([0, 1000, 2000, 0])
    s = summarize(k.launch.table, made_up)
    assert sum(v["n"] for v in s["types"].values()) == n and s["end_us"] == 10 * (n - 1) + 2
    assert not any("own" in v for v in s["types"].values())
    # a fifth word, the start of a task's late waits (0: none), 0.5 µs after ready for the in-projection tiles
    late = torch.tensor([task[0] == INPROJ for task in k.launch.table.tasks])
    own = torch.where(late, made_up[:, 1] + 500, 0)
    s5 = summarize(k.launch.table, torch.cat([made_up, own[:, None]], dim=1))
    assert s5["types"]["in_proj"]["own"] == 0.5 and sum("own" in v for v in s5["types"].values()) == 1
    assert "| 0.5 |" in format_summary(s5)
    path = [p["type"] for p in s["critical_path"]]
    assert path[0] == "attn mix" and path[-1] == "ffn reduce" and "kda head" in path and "gate_up" in path
    assert all(p["handoff"] > 0 for p in s["critical_path"][1:]) and "critical path" in format_summary(s)
