"""The stage schedule (knob `launch`, kernels/runtime/stages.py) under the interpreter on `tiny`: a kind's stages
as launches of one program per task, the same bits as the persistent launch; the waits that remain in a stages
build (inside a stage, on the peers), each stuck and named by its number among all the stages' sites."""

import pytest
import torch

from glm53ctl.kernels.checks import check_key, fault_key, make_harness
from glm53ctl.kernels.ops.gemv.tasks import OPROJ
from glm53ctl.kernels.ops.kda.tasks import KDA_HEAD
from glm53ctl.kernels.ops.mhc.tasks import RED_A
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.stages import SeparateLaunches, stage_table
from glm53ctl.kernels.runtime.table import PEER
from glm53ctl.kernels.runtime.tasks import may_run, types_mask
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from tests.helpers import assert_same_bits, resolved

pytestmark = pytest.mark.interpreter


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=13)


def _both(weights, kind, tp, rows, seed=5, knobs=None):
    """(persistent outputs, stages outputs, the stages harness) on one key's fresh inputs, outputs poisoned."""
    kp = make_harness(weights, resolved(kind, tp, rows))
    ks = make_harness(weights, resolved(kind, tp, rows, {"launch": "stages"} | (knobs or {})))
    x = kp.inputs(seed=seed)[0]
    peers = kp.peer_partials(x)
    a = {n: t.clone() for n, t in kp(x, peers, poison=True).items()}
    return a, {n: t.clone() for n, t in ks(x, peers, poison=True).items()}, ks


def test_a_stages_build_is_its_stage_launches_one_program_per_task(weights):
    k = make_harness(weights, resolved("dense", 2, 1, {"launch": "stages"}))
    chain = k.launch
    assert isinstance(chain, SeparateLaunches) and len(chain.stages) == len(k.STAGES)
    whole = chain.whole.table
    ids = sorted(i for s in chain.stages for i in s.table.ids)
    assert ids == list(range(whole.n_tasks))  # every task in exactly one stage
    for s in chain.stages:
        assert s.one_task and s.pdl and s.grid == s.table.n_tasks
        assert s.constexprs()["ONE_TASK"] and s.constexprs()["sched"].WEIGHTS_FIRST
    # the waits that remain: inside a stage (gate/up's K slices, the FFN mix on the attention reduce), the peers'
    kept = {(whole.type_name(s.table.ids[site.task]), site.kind) for s in chain.stages for site in s.table.sites}
    assert ("attn reduce", PEER) in kept and ("ffn reduce", PEER) in kept
    assert len(chain.table.sites) < len(whole.sites)


def test_stage_tables_keep_the_peers_waits_and_the_whole_tables_ids(weights):
    k = make_harness(weights, resolved("dense", 4, 1))
    whole = k.launch.table
    t = stage_table(whole, (RED_A,))
    assert t.peers == whole.peers == 3 and t.ids == [i for i, task in enumerate(whole.tasks) if task[0] == RED_A]
    assert all(s.kind == PEER and s.producers == [-1, -2, -3] for s in t.sites)
    heads = stage_table(whole, (KDA_HEAD,))
    assert heads.describe_task(0) == whole.describe_task(heads.ids[0])  # a fault names the whole table's task


@pytest.mark.parametrize("kind, tp, rows", [("embed", 4, 2), ("tail", 2, 3), ("dense", 2, 1), ("kda", 1, 2)])
def test_stages_give_the_persistent_launchs_bits(weights, kind, tp, rows):
    a, b, ks = _both(weights, kind, tp, rows)
    assert_same_bits(a, b, f"{kind} tp{tp} r{rows} stages")
    epoch = ks.launch.runtime.epoch
    ks(ks.inputs(seed=5)[0], None)
    assert ks.launch.runtime.epoch == epoch + 1  # every stage's tag advanced once


@pytest.mark.parametrize("kind, tp, rows", [("dense", 2, 1), ("kda", 1, 2)])
def test_stages_of_their_own_code_give_the_persistent_launchs_bits(weights, kind, tp, rows):
    """Knob stage_code=own: each stage's kernel built for its own task types (the others' branches not built)."""
    a, b, ks = _both(weights, kind, tp, rows, knobs={"stage_code": "own"})
    assert_same_bits(a, b, f"{kind} tp{tp} r{rows} stages, own code")
    for s in ks.launch.stages:
        assert s.constexprs()["sched"].ONLY == types_mask(s.code_types) != 0
        assert {t[0] for t in s.table.tasks} <= set(s.code_types)


def test_a_launch_of_shared_code_holds_every_task_type(weights):
    for knobs in ({}, {"launch": "stages"}, {"stage_code": "own"}):  # own code is a stage's alone
        k = make_harness(weights, resolved("kda", 1, 2, knobs))
        launches = getattr(k.launch, "stages", [k.launch])
        assert all(s.constexprs()["sched"].ONLY == 0 for s in launches)


def test_may_run_is_a_compile_time_test_of_a_launchs_task_types():
    only = types_mask([OPROJ, RED_A])
    assert may_run(only, OPROJ) and may_run(only, (KDA_HEAD, RED_A)) and not may_run(only, KDA_HEAD)
    assert may_run(0, KDA_HEAD)  # 0: every type


@pytest.mark.slow
def test_sparse_stages_give_the_persistent_launchs_bits(weights):
    a, b, _ = _both(weights, "sparse", 2, 2)
    assert_same_bits(a, b, "sparse tp2 r2 stages")
    _, c, _ = _both(weights, "sparse", 2, 2, knobs={"stage_code": "own"})
    assert_same_bits(a, c, "sparse tp2 r2 stages, own code")


@pytest.mark.slow
def test_the_step_in_stages_gives_the_persistent_steps_bits_at_tp2(weights):
    """`model` with launch=stages handed to every part, one step at TP2 (TP1 over two steps: test_model's check)."""
    from glm53ctl.kernels.kinds.model.harness import ModelHarness

    kp = ModelHarness(weights, resolved("model", 2, 1), steps=1)
    ks = ModelHarness(weights, resolved("model", 2, 1, {"launch": "stages"}), steps=1)
    assert all(p.knobs.launch == "stages" for p in resolved("model", 2, 1, {"launch": "stages"}).parts)
    assert all(isinstance(h.launch, SeparateLaunches) for _, h in ks.launch.parts)
    x = kp.inputs(seed=3)[0]
    assert_same_bits(kp(x, poison=True), ks(x, poison=True), "model tp2 r1 stages")


@pytest.mark.parametrize("kind", ["embed", "tail"])
def test_every_site_of_a_stages_build_is_named(weights, kind):
    res = fault_key(weights, resolved(kind, 2, 2, {"launch": "stages"}), None, int(2e6), 120.0)
    assert res.ok and res.sites == res.named >= 1, res.problems


def test_a_stuck_wait_inside_a_stage_and_on_a_peer_named_by_its_number(weights):
    """dense TP2: a gate/up tile's late wait on its K slices (inside its stage), the FFN mix's on the attention
    reduce (one stage) and the attention reduce's on the peer: each stuck is named with its number among the
    stages' sites, the whole table's task, the producer; the retried launch gives the clean bits."""
    k = make_harness(weights, resolved("dense", 2, 1, {"launch": "stages"}))
    x = k.inputs(seed=9)[0]
    peers = k.peer_partials(x)
    clean = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    chain = k.launch
    whole = chain.whole.table
    picks = {}
    for j, s in enumerate(chain.stages):
        for i, site in enumerate(s.table.sites):
            name = whole.type_name(s.table.ids[site.task])
            picks.setdefault(name, (chain.offsets[j] + i, s.table, site))
    assert set(picks) == {"gate_up", "ffn mix", "attn reduce", "ffn reduce"}
    for name in ("gate_up", "ffn mix", "attn reduce"):
        number, table, site = picks[name]
        with pytest.raises(LaunchFault) as e:
            k(x, peers, stuck_site=number)
        assert e.value.site == number and e.value.task == table.describe_task(site.task), name
        want = {"gate_up": "gate_up", "ffn mix": "attn reduce", "attn reduce": "peer rank 1"}[name]
        assert want in e.value.producer, (name, e.value.producer)
        assert_same_bits(clean, k(x, peers, poison=True), f"the retry after {name}'s site")


def test_check_proves_the_other_schedule_and_says_where_it_differs(weights, monkeypatch):
    res, _ = check_key(weights, resolved("embed", 2, 1), 0)
    assert res.ok and res.schedules_equal
    real = SeparateLaunches.__call__

    def off_by_one_bit(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        out.view(torch.int16).view(-1)[0] ^= 1
        return out

    monkeypatch.setattr(SeparateLaunches, "__call__", off_by_one_bit)
    res, _ = check_key(weights, resolved("embed", 2, 1), 0)
    assert not res.schedules_equal and "launch=stages gives other bits than launch=persistent" in res.problems
    res, _ = check_key(weights, resolved("embed", 2, 1, {"launch": "stages"}), 0)
    assert not res.schedules_equal and "launch=persistent gives other bits than launch=stages" in res.problems


def test_fault_lists_the_waits_a_stages_build_keeps(capsys):
    from tests.helpers import invoke, invoke_json

    args = ["fault", "--kind", "dense", "--tp", "2", "--rows", "1", "--list"]
    persistent = invoke_json(capsys, *args)["keys"][0]
    stages = invoke_json(capsys, *args, "--launch", "stages")["keys"][0]
    assert persistent["launch"] == "persistent" and stages["launch"] == "stages"
    assert set(stages["waits"]) == {
        "attn reduce <- peer",
        "ffn mix <- attn reduce",
        "gate_up <- gate_up (late)",
        "ffn reduce <- peer",
    }
    assert "attn gate <- attn mix" in persistent["waits"] and stages["sites"] < persistent["sites"]
    code, _, err = invoke(capsys, *args, "--launch", "pipelined")
    assert code == 2 and "--launch 'pipelined': expected one of persistent, stages" in err


def test_a_down_waiting_inside_gate_ups_stage_is_named(weights):
    """kda TP2, knob down_stage=gate_up: an expert's down projection waits on its slot's gate/up inside one stage
    launch (not across the launch boundary); stuck, it is named with its number among the stages' sites, the
    whole table's task and the gate/up it waits on, and the retried launch gives the clean bits."""
    k = make_harness(weights, resolved("kda", 2, 1, {"launch": "stages", "down_stage": "gate_up"}))
    x = k.inputs(seed=4)[0]
    peers = k.peer_partials(x)
    clean = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    chain = k.launch
    whole = chain.whole.table
    picks = [
        (chain.offsets[j] + i, s.table, site)
        for j, s in enumerate(chain.stages)
        for i, site in enumerate(s.table.sites)
        if whole.type_name(s.table.ids[site.task]) == "expert down"
    ]
    assert picks, "no wait of a down inside a stage"
    number, table, site = picks[0]
    with pytest.raises(LaunchFault) as e:
        k(x, peers, stuck_site=number)
    assert e.value.site == number and e.value.task == table.describe_task(site.task)
    assert "gate_up" in e.value.producer, e.value.producer
    assert_same_bits(clean, k(x, peers, poison=True), "the retry after the down's site")
