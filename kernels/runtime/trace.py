"""Reading a traced launch: when each task was claimed, had its inputs and published (device.stamp), per task
type and along the critical path. A diagnostic for the GPU benchmarks: where a launch's time goes."""

from __future__ import annotations

from collections import defaultdict

import torch

from glm53ctl.kernels.runtime.table import TaskTable


def producers(table: TaskTable) -> list[list[int]]:
    """Each task's producer tasks (peers left out: their partials are in place before the launch)."""
    out = [[] for _ in range(table.n_tasks)]
    for s in table.sites:
        out[s.task] += [p for p in s.producers if p >= 0]
    return out


def summarize(table: TaskTable, trace: torch.Tensor) -> dict:
    """trace [n_tasks, 4 or 5] int64 (claimed, ready, published in ns; program; optionally the start of the task's
    late waits) of one launch, as µs from the first claim: per task type the first claim, first ready, last ready
    and last publish, the mean wait and work (and own work, where late waits were stamped);
    and the critical path back from the last publish (each step's latest producer), with the gap from that
    producer's publish to the task's ready: the hand-off's cost on the path."""
    t = trace.cpu().tolist()
    t0 = min(r[0] for r in t)
    us = lambda ns: (ns - t0) / 1000  # noqa: E731
    types: dict[str, dict] = defaultdict(lambda: {"n": 0, "wait": 0.0, "work": 0.0})
    for task, (claimed, ready, done, _, *own) in enumerate(t):
        s = types[table.type_name(task)]
        if own and own[0] > 0:  # stamped before its late waits: its own work, apart from waiting for the others
            s["own"] = s.get("own", 0.0) + (own[0] - ready) / 1000
            s["n_own"] = s.get("n_own", 0) + 1
        s["n"] += 1
        s["first_claim"] = min(s.get("first_claim", 1e18), us(claimed))
        s["first_ready"] = min(s.get("first_ready", 1e18), us(ready))
        s["last_ready"] = max(s.get("last_ready", -1e18), us(ready))
        s["last_done"] = max(s.get("last_done", -1e18), us(done))
        s["wait"] += (ready - claimed) / 1000
        s["work"] += (done - ready) / 1000
    for s in types.values():
        s["wait"] /= s["n"]
        s["work"] /= s["n"]
        if "own" in s:
            s["own"] /= s.pop("n_own")
    path = []
    for task, before in critical_path(table, t):
        step = {"task": task, "type": table.type_name(task), "program": t[task][3]}
        step |= {"claimed": us(t[task][0]), "ready": us(t[task][1]), "done": us(t[task][2])}
        if before is not None:
            step["handoff"] = (t[task][1] - t[before][2]) / 1000
        path.append(step)
    return {"end_us": us(max(r[2] for r in t)), "types": dict(types), "critical_path": path}


def critical_path(table: TaskTable, t: list[list[int]]) -> list[tuple[int, int | None]]:
    """The critical path of a traced launch, first step first: back from the last publish, each step's latest
    producer; each step as (task, the producer it waited on last, None for the first)."""
    prods = producers(table)
    task = max(range(len(t)), key=lambda i: t[i][2])
    path = []
    while True:
        before = max(prods[task], key=lambda p: t[p][2], default=None)
        path.append((task, before))
        if before is None:
            return path[::-1]
        task = before


def chrome_events(table: TaskTable, trace: torch.Tensor, pid: int, name: str, t0: int | None = None) -> list[dict]:
    """One traced launch in the Trace Event Format (the JSON the Perfetto UI and chrome://tracing open): a process
    `name`, a track per program, and per task a slice of its wait (claimed -> ready) and one of its work (ready ->
    published), named by its task type, with the task's index; the critical path's work slices in category
    "critical" and a flow arrow from each of its steps to the next. Times in µs from t0 (ns; default the
    launch's first claim: the parts of a step traced in one replay share one t0 and so one time line)."""
    t = trace.cpu().tolist()
    t0 = min(r[0] for r in t) if t0 is None else t0
    us = lambda ns: (ns - t0) / 1000  # noqa: E731
    path = critical_path(table, t)
    on_path = {task for task, _ in path}
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]
    for program in sorted({r[3] for r in t}):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": pid, "tid": program, "args": {"name": f"program {program}"}}
        )
    for task, (claimed, ready, done, program, *_) in enumerate(t):
        kind, args = table.type_name(task), {"task": task}
        if ready > claimed:
            events.append(_slice(pid, program, "wait " + kind, "wait", us(claimed), us(ready), args))
        cat = "critical" if task in on_path else "work"
        events.append(_slice(pid, program, kind, cat, us(ready), us(done), args))
    for n, (task, before) in enumerate(path):
        if before is None:
            continue
        flow = {"name": "critical path", "cat": "critical", "id": pid * 1_000_000 + n, "pid": pid}
        events.append(flow | {"ph": "s", "tid": t[before][3], "ts": us(t[before][2])})
        events.append(flow | {"ph": "f", "bp": "e", "tid": t[task][3], "ts": us(t[task][1])})
    return events


def _slice(pid: int, tid: int, name: str, cat: str, start: float, end: float, args: dict) -> dict:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": start,
        "dur": max(end - start, 0.0),
        "args": args,
    }


def format_summary(s: dict) -> str:
    """The summary as two short tables: per type, then the critical path with consecutive steps of one type
    merged."""
    lines = [f"launch: {s['end_us']:.1f} us from the first claim to the last publish"]
    head = "| type | tasks | first claim | first ready | last ready | last publish | mean wait | mean work | own |"
    lines.append(head)
    for name, v in sorted(s["types"].items(), key=lambda kv: kv[1]["first_claim"]):
        own = f"{v['own']:.1f}" if "own" in v else "-"
        lines.append(
            f"| {name} | {v['n']} | {v['first_claim']:.1f} | {v['first_ready']:.1f} | {v['last_ready']:.1f} | "
            f"{v['last_done']:.1f} | {v['wait']:.1f} | {v['work']:.1f} | {own} |"
        )
    lines.append("(own: of a task with late waits, ready to the start of those waits: its work apart from the others)")
    lines.append("critical path: type (ready -> publish, hand-off before it; 'late': the task had started and waited")
    lines.append("at its end: a folded GEMV for its gates, a KDA head's or gate/up tile's first part for the others)")
    for p in s["critical_path"]:
        h = p.get("handoff", 0.0)
        step = f"(+{h:.2f})" if h >= 0 else "(late)"
        lines.append(f"  {p['type']:<14} {p['ready']:7.1f} -> {p['done']:7.1f}  {step}")
    return "\n".join(lines)
