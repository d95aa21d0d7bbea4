"""Progress that holds (issue 30, case 7): the estimate weighs keys by their work, workers take the heaviest keys
first, and a long key says where it is while it runs (before: "~0:20 left" with five minutes to go, and minutes of
silence inside `check --kind model` or `fault --kind dense,kda,sparse`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from glm53ctl import output
from tests.helpers import invoke


def test_the_estimate_weighs_keys_by_their_work(monkeypatch):
    """Three light keys done in 3 s, a key 100 times heavier to go: the estimate is about its 100 s, not 1 s
    (an average per key)."""
    clock = iter([0.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(output.time, "monotonic", lambda: next(clock))
    p = output.Progress(4, costs=[1, 1, 1, 100])
    for _ in range(2):
        p.line("light", 1)
    line = p.line("light", 1)
    assert line.startswith("  [3/4, 0:03 elapsed, ~1:40 left]"), line


def test_the_heaviest_keys_go_first_and_costs_follow_the_tables():
    from glm53ctl.commands.check import _costs, _per_key, _setup

    _, weights, keys = _setup("tiny", "embed,sparse", "1", "1")
    costs = _costs(weights.spec, keys)
    assert costs[1] > 5 * costs[0]  # a sparse layer's tables against embed's
    order = [i for i, _ in _per_key(lambda key, weights: key.kind, weights, keys, 1, costs=costs)]
    assert order == [0, 1]  # in this process: as given
    fault = _costs(weights.spec, keys, per_site=True)
    assert all(f > c for f, c in zip(fault, costs, strict=True))


@pytest.mark.slow
def test_a_long_key_says_where_it_is(capfd, monkeypatch):
    """Every GLM53CTL_HEARTBEAT_S seconds a line from inside the key: where it is and how long it has been there
    (fault's keys run in a worker process: its lines reach the terminal by file descriptor 2)."""
    monkeypatch.setenv("GLM53CTL_HEARTBEAT_S", "0.2")
    code, _, err = invoke(capfd, "fault", "--kind", "tail", "--tp", "2", "--rows", "8", "--jobs", "1")
    beats = [ln for ln in err.splitlines() if ln.startswith("    ... tiny/tail/tp2/r8: ")]
    assert code == 0 and beats, err
    assert any(" sites stuck, " in b for b in beats) and all(b.endswith(" in this key") for b in beats), beats


BEATING = """
import sys, time
from glm53ctl.output import Heartbeat
with Heartbeat(sys.argv[1] * 300, every=0.0005) as beat:
    for i in range(400):
        beat(f"step {i} " + sys.argv[1] * 200)
        time.sleep(0.001)
"""


def test_workers_heartbeats_never_run_together_on_one_line():
    """Two workers beating at once into one pipe (the parent's stderr): every line is one worker's, whole."""
    r, w = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", BEATING, name], stderr=w, stdout=subprocess.DEVNULL) for name in "ab"
    ]
    os.close(w)
    with os.fdopen(r) as f:
        lines = f.read().splitlines()
    assert all(p.wait() == 0 for p in procs)
    whole = re.compile(r"    \.\.\. (a{300}|b{300}): (starting|step \d+ (a{200}|b{200})), 0:0\d in this key")
    assert len(lines) > 20 and all(whole.fullmatch(line) and len(set(line[8:308])) == 1 for line in lines), [
        line[:80] for line in lines if not whole.fullmatch(line)
    ][:3]


def test_one_process_on_a_gpu_keeps_one_kind_and_widths_weights_at_a_time(monkeypatch):
    """In one process on a GPU, the checkpoint-layout tensors of the keys before go when the kind or the width
    changes (12 keys of three kinds at TP4 and TP8 filled an 80 GB H100), and stay within one; on a CPU they stay."""
    import torch

    from glm53ctl.commands.check import _per_key

    class Drawn:
        drops = 0

        def drop_raw(self):
            self.drops += 1

    keys = [SimpleNamespace(kind=k, tp=t) for k, t in (("dense", 4), ("dense", 4), ("dense", 8), ("kda", 8))]
    weights = Drawn()
    assert [i for i, _ in _per_key(lambda key, weights: key, weights, keys, 1)] == [0, 1, 2, 3]
    assert weights.drops == 0  # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert [i for i, _ in _per_key(lambda key, weights: key, weights, keys, 1)] == [0, 1, 2, 3]
    assert weights.drops == 3  # before dense TP4, dense TP8 and kda TP8
