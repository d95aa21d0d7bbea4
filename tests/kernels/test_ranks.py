"""Real ranks on the CPU (issue 22's part that needs no GPU): one process per rank, each rank's launch in the
interpreter pushing its partial and tag into its peers' shared-memory mailboxes; every rank's result the
emulation's bit for bit; a peer that never publishes named by the rank waiting on it, nothing hanging, the
retried launch clean; the launcher's failure paths."""

import os
import time

import pytest
import torch

from glm53ctl.errors import UsageError
from glm53ctl.kernels.runtime.ranks import NVLS_OFF, RankFailed, RankLayout, run_ranks
from tests.helpers import resolved

pytestmark = [pytest.mark.interpreter]


def _env_and_rank(group):
    return group.rank, {k: os.environ.get(k) for k in NVLS_OFF}, str(group.device)


def _fail_on_one(group):
    if group.rank == 1:
        raise ValueError("rank 1 says no")
    return group.rank


def _hang_on_one(group):
    if group.rank == 1:
        time.sleep(600)
    return group.rank


def test_one_rank_per_gpu_or_the_emulation():
    assert not RankLayout(4, 1).real and RankLayout(4, 4, "cpu").real
    with pytest.raises(UsageError, match="one rank per GPU"):
        RankLayout(4, 2, "cpu")
    if torch.cuda.device_count() < 8:
        with pytest.raises(UsageError, match="this machine has"):
            RankLayout(8, 8)


def test_ranks_run_in_their_own_processes_with_multicast_off():
    out = run_ranks(RankLayout(2, 2, "cpu"), _env_and_rank, timeout_s=120)
    assert [r for r, _, _ in out] == [0, 1]
    assert all(env == NVLS_OFF for _, env, _ in out) and {d for *_, d in out} == {"cpu"}


def test_a_rank_that_raises_or_hangs_is_named():
    with pytest.raises(RankFailed, match="rank 1 of 2 failed: ValueError: rank 1 says no"):
        run_ranks(RankLayout(2, 2, "cpu"), _fail_on_one, timeout_s=120)
    start = time.monotonic()
    with pytest.raises(RankFailed, match=r"ranks \[1\] of 2 did not finish"):
        run_ranks(RankLayout(2, 2, "cpu"), _hang_on_one, timeout_s=8)
    assert time.monotonic() - start < 40


def test_check_and_fault_on_real_ranks(capsys):
    """`check --gpus 2`: three launches in a row on two processes (the mailboxes' halves in turn, no reset), every
    rank's outputs the emulation's bit for bit (embed's H; tail's ĥ and the full logits on every rank);
    `fault --gpus 2`: each rank muted in turn is named by the other, nothing hangs, the next launch is clean; each
    rank killed in turn mid-launch is reported dead and named by the other, whose guard stops it.
    (Every TP x rows key: docs/perf/ranks.md.)"""
    from tests.helpers import invoke_json

    res = invoke_json(capsys, "check", "--kind", "embed,tail", "--tp", "2", "--rows", "2", "--gpus", "2")
    assert [r["key"] for r in res["keys"]] == ["tiny/embed/tp2/r2", "tiny/tail/tp2/r2"]
    assert res["summary"] == "12 of 12 rank launches bitwise equal to the one-device emulation"
    key = ("--kind", "embed", "--tp", "2", "--rows", "1", "--gpus", "2")
    res = invoke_json(capsys, "fault", *key, "--budget-ms", "20")
    assert res["totals"] == {
        "peers": 2,
        "named": 2,
        "hangs": 0,
        "retries_equal": 2,
        # each rank killed (SIGKILL) during its launch in turn: reported dead, named by the other, nothing left
        "killed": 2,
        "killed_reported": 2,
    }


def test_a_layer_kind_on_real_ranks(capsys):
    """`check --gpus 2` for kda: two processes, each running the whole layer on its shard (its KDA heads, its share
    of every expert) and pushing both all-reduces' partials into the other's mailbox, three launches in a row;
    every rank's outputs (the routing replicated) and its slices of the KDA states' writes the emulation's bit for
    bit. `fault --gpus 2` for every layer kind: each rank muted in turn is named by the other at its reduce,
    nothing hangs, the next launch is clean; each killed in turn mid-launch is reported dead and named. (dense and
    sparse on real ranks over several steps: tests/cli/test_run.py; TP4 and more by hand, docs/perf/ranks.md.)"""
    from tests.helpers import invoke_json

    res = invoke_json(capsys, "check", "--kind", "kda", "--tp", "2", "--rows", "1", "--gpus", "2")
    assert [r["key"] for r in res["keys"]] == ["tiny/kda/tp2/r1"]
    assert res["summary"] == "6 of 6 rank launches bitwise equal to the one-device emulation"
    key = ("--kind", "dense,kda,sparse", "--tp", "2", "--rows", "1", "--gpus", "2", "--budget-ms", "20")
    res = invoke_json(capsys, "fault", *key)
    assert [r["key"] for r in res["keys"]] == [f"tiny/{k}/tp2/r1" for k in ("dense", "kda", "sparse")]
    assert res["totals"] == {"peers": 6, "named": 6, "hangs": 0, "retries_equal": 6, "killed": 6, "killed_reported": 6}


def test_every_layer_kind_on_four_real_ranks(capsys):
    """`check --gpus 4` of dense, kda and sparse at rows 1: four processes, each pushing both all-reduces'
    partials into three peers' mailboxes; every rank the emulation's bits."""
    from tests.helpers import invoke_json

    res = invoke_json(capsys, "check", "--kind", "dense,kda,sparse", "--tp", "4", "--rows", "1", "--gpus", "4")
    assert [r["key"] for r in res["keys"]] == [f"tiny/{k}/tp4/r1" for k in ("dense", "kda", "sparse")]
    assert res["summary"] == "36 of 36 rank launches bitwise equal to the one-device emulation"


def test_the_layer_kinds_on_real_ranks_in_the_stage_schedule(capsys):
    """`check --gpus 2 --launch stages`: each rank runs its layer as the kind's stage launches, the pushes in the
    stage of the tiles they push, the reduces' stages reading their peers' words where the peers write them (the
    whole table's place in the mailbox) and their own words apart: every rank the emulation's bits. `fault`:
    each rank muted in turn is named by the other's reduce stage, nothing hangs, the retry is clean."""
    from tests.helpers import invoke_json

    res = invoke_json(capsys, "check", "--kind", "dense,sparse", "--tp", "2", "--rows", "1", "--gpus", "2",
                      "--launch", "stages")  # fmt: skip
    assert [r["key"] for r in res["keys"]] == ["tiny/dense/tp2/r1", "tiny/sparse/tp2/r1"]
    assert res["summary"] == "12 of 12 rank launches bitwise equal to the one-device emulation"
    key = ("--kind", "kda", "--tp", "2", "--rows", "1", "--gpus", "2", "--budget-ms", "20", "--launch", "stages")
    res = invoke_json(capsys, "fault", *key)
    assert res["totals"] == {"peers": 2, "named": 2, "hangs": 0, "retries_equal": 2, "killed": 2, "killed_reported": 2}


def test_a_launch_timed_on_real_ranks():
    """`bench --gpus T`'s timing (tuning/bench_ranks.py), the same code on a CPU under the interpreter with the
    host's clock: every rank builds its part, compiles, meets the others, times its rounds and checks its guards;
    the figure is the median of each round's slowest rank. (On a CPU the command itself refuses: exit 2.)"""
    from glm53ctl.kernels.checks import key_seed, make_harness
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights
    from glm53ctl.tuning.bench_ranks import time_on_ranks

    key = resolved("dense", 2, 1, {"launch": "stages"})
    x = make_harness(Weights(load_model("tiny"), seed=0), key).inputs(key_seed(0, key.name))[0]
    r = time_on_ranks(key, x, rounds=3, launches=1)
    assert len(r["per_rank_us"]) == 2 and len(r["rounds_us"]) == 3 and min(r["rounds_us"]) > 0
    assert r["launches_per_round"] == 1 and r["us"] in r["rounds_us"]


def test_the_whole_step_on_real_ranks(capsys):
    """`check --gpus 2 --kind model`: each rank runs embed, every layer and tail, each part its own kind's launch
    on the rank's shards with mailboxes of its own, two steps in a row (each layer's state carried on the rank):
    every rank's outputs, its slices of every KDA state and the caches' written slots the one-device step's, bit
    for bit. (`fault --gpus 2 --kind model` by hand: docs/perf/ranks.md.)"""
    from tests.helpers import invoke_json

    res = invoke_json(capsys, "check", "--kind", "model", "--tp", "2", "--rows", "1", "--gpus", "2")
    assert [r["key"] for r in res["keys"]] == ["tiny/model/tp2/r1"]
    assert res["summary"] == "2 of 2 rank launches bitwise equal to the one-device emulation"


def test_a_peer_that_never_publishes_is_named_and_the_retry_is_clean():
    """Rank 2 of TP4 never publishes its tag: every other rank's reduce times out naming peer rank 2 alone (its
    other peers did publish) and the site; rank 2, whose peers published, finishes; nobody hangs; the next
    launch on every rank gives the emulation's bits."""
    from glm53ctl.kernels.kinds.embed.harness import EmbedHarness
    from glm53ctl.kernels.kinds.embed.ranks import rank_launches
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    tokens = [[900], [900]]
    out = run_ranks(
        RankLayout(4, 4, "cpu"), rank_launches, resolved("embed", 4, 1), tokens, [2, -1], int(2e7), timeout_s=600
    )
    want = EmbedHarness(Weights(load_model("tiny"), seed=0), resolved("embed", 4, 1))(torch.tensor(tokens[0]))["H"]
    for rank in (0, 1, 3):
        assert isinstance(out[rank][0], str), rank
        assert "embed launch fault at site 1: task 1 (embed reduce) waited for peer rank 2 (" in out[rank][0]
    assert torch.equal(out[2][0]["H"], want)
    assert all(torch.equal(out[rank][1]["H"], want) for rank in range(4))  # the retry, on every rank
