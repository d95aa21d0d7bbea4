"""A traced launch read back (kernels/runtime/trace.py): its critical path, and the launch as a Chrome trace
(`bench --trace --perfetto FILE`), checked against the Trace Event Format that Perfetto's UI reads. The trace is
made here from a real task table, as a GPU's stamps would be: each task claimed by one of 4 programs in table
order, ready after its last producer published, publishing after its work (a GPU timing faked: the stamps need a
GPU's clock; `bench --trace` reads real ones)."""

import json
import random

import torch

from glm53ctl.kernels.kinds import get_kind
from glm53ctl.kernels.kinds.layer.table import Dims, build_table
from glm53ctl.kernels.runtime.trace import chrome_events, critical_path, producers, summarize
from glm53ctl.kernels.spec import load_model

PROGRAMS = 4


def _table_and_trace(seed: int = 0):
    knobs = get_kind("dense").record(grid=PROGRAMS)
    table = build_table(Dims(load_model("tiny"), 2, knobs), 2, knobs)
    rng, prods = random.Random(seed), producers(table)
    free = [1_000_000 + 50 * p for p in range(PROGRAMS)]  # ns at which each program claims its next task
    rows = []
    for task in range(table.n_tasks):
        program = min(range(PROGRAMS), key=free.__getitem__)
        claimed = free[program]
        ready = max([claimed] + [rows[p][2] + 200 for p in prods[task]])  # the hand-off: 200 ns after a publish
        done = ready + rng.randrange(300, 3000)
        rows.append([claimed, ready, done, program])
        free[program] = done + 20
    return table, torch.tensor(rows, dtype=torch.int64)


def test_the_critical_path_runs_back_from_the_last_publish_by_each_steps_latest_producer():
    table, trace = _table_and_trace()
    t, prods = trace.tolist(), producers(table)
    path = critical_path(table, t)
    assert path[-1][0] == max(range(len(t)), key=lambda i: t[i][2]) and path[0][1] is None and not prods[path[0][0]]
    for (before, _), (task, waited) in zip(path, path[1:], strict=False):
        assert waited == before == max(prods[task], key=lambda p: t[p][2])
    s = summarize(table, trace)
    assert [p["task"] for p in s["critical_path"]] == [task for task, _ in path]


def _check_trace_event_format(doc: dict) -> None:
    """The Trace Event Format's rules for the phases written: metadata (M) names a process or a thread; a complete
    event (X) has a start and a duration of at least 0; a flow has a start (s) and an end (f) of one id."""
    assert set(doc) == {"traceEvents", "displayTimeUnit"} and doc["displayTimeUnit"] in ("ms", "ns")
    flows: dict[int, list[str]] = {}
    for ev in doc["traceEvents"]:
        assert ev["ph"] in ("M", "X", "s", "f"), ev
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int) and isinstance(ev["name"], str), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name") and isinstance(ev["args"]["name"], str)
            continue
        assert isinstance(ev["ts"], int | float) and ev["ts"] >= 0 and isinstance(ev["cat"], str), ev
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], int | float) and ev["dur"] >= 0, ev
        else:
            flows.setdefault(ev["id"], []).append(ev["ph"])
    assert all(sorted(f) == ["f", "s"] for f in flows.values()), flows


def test_a_traced_launch_as_a_chrome_trace_perfetto_opens():
    table, trace = _table_and_trace()
    events = chrome_events(table, trace, 0, "tiny/dense/tp2/r2")
    doc = json.loads(json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
    _check_trace_event_format(doc)
    threads = {ev["tid"] for ev in events if ev["ph"] == "M" and ev["name"] == "thread_name"}
    assert threads == set(range(PROGRAMS))  # a track per program
    work = [ev for ev in events if ev["ph"] == "X" and not ev["name"].startswith("wait ")]
    assert sorted(ev["args"]["task"] for ev in work) == list(range(table.n_tasks))  # a slice per task's work
    assert {ev["name"] for ev in work} == {table.type_name(t) for t in range(table.n_tasks)}
    path = [task for task, _ in critical_path(table, trace.tolist())]
    assert sorted(ev["args"]["task"] for ev in work if ev["cat"] == "critical") == sorted(path)
    assert sum(ev["ph"] == "s" for ev in events) == len(path) - 1  # an arrow from each step to the next
    t = trace.tolist()
    last = max(work, key=lambda ev: ev["ts"] + ev["dur"])
    assert abs(last["ts"] + last["dur"] - (max(r[2] for r in t) - min(r[0] for r in t)) / 1000) < 1e-6


def test_bench_gathers_every_keys_launches_into_one_trace():
    """`bench --perfetto`: each key's launches become processes named by the key, flow ids stay unique, and the
    rows lose the events (their JSON stays the size it was)."""
    from glm53ctl.commands.bench import perfetto_trace

    table, trace = _table_and_trace()
    rows = []
    for tp in (2, 4):
        rows.append(
            {"kind": "dense", "tp": tp, "rows": 2, "trace": {"perfetto": chrome_events(table, trace, 0, "launch")}}
        )
    doc = perfetto_trace(rows)
    _check_trace_event_format(doc)
    names = [ev["args"]["name"] for ev in doc["traceEvents"] if ev["name"] == "process_name"]
    assert names == ["dense TP2 r2: launch", "dense TP4 r2: launch"]
    assert all("perfetto" not in r["trace"] for r in rows)
