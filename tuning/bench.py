"""`glm53ctl bench`: µs per launch of a key against the copy-bandwidth floor, beside its baselines and another
tree (docs/design.md §8). Built on tuning/measure.py; a kind is benched through its harness (`timed`, `stock`:
kernels/kinds/harness.py), so a kind added to the registry is benched with no change here.

- µs per launch: a CUDA graph of launches over rotated copies of what a launch streams (each copy comes back
  only after more than twice the L2 has streamed), replayed; the median over rounds.
- The floor: every byte the launch moves over the copy bandwidth measured in the same run.
- Baselines, each timed in alternating rounds with the launch (A B B A), the ratio baseline / launch with its
  bootstrap interval: `separate` (the same task bodies, one launch per stage), `separate-pdl` (the same chained
  by programmatic dependent launch), `torch` (rank 0's share of the math as stock PyTorch ops in bf16, in a
  CUDA graph), `compile` (the same through `torch.compile`, then a CUDA graph), `defaults` (the launch with the
  registry's knob defaults, not the tuned file's).
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import warnings
from contextlib import contextmanager
from dataclasses import replace

import torch

from glm53ctl.kernels import kernel_cache
from glm53ctl.kernels.checks import build_launches, key_seed, make_harness, outputs_equal
from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds import get_kind, load_harness
from glm53ctl.kernels.runtime.launch import on_device
from glm53ctl.kernels.runtime.tasks import name_of
from glm53ctl.kernels.runtime.trace import chrome_events, summarize
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.tuning import measure
from glm53ctl.tuning.bench_ranks import time_on_ranks
from glm53ctl.tuning.knobs import defaults, kind_knobs, legacy_key

BASELINES = ("separate", "separate-pdl", "torch", "compile", "defaults", "persistent", "stages", "chain")
SCHEDULES = ("persistent", "stages")  # knob `launch`: the key in this schedule, another harness
# at most this many copies: a launch that reads little (embed: R rows of its table) would need thousands to
# stream past the L2; its bytes are too few for the floor to mean much anyway
MAX_COPIES = 64
# at least this many launches per graph replay, so a replay's own cost stays small beside them
MIN_LAUNCHES = 40


def timer_for(t, min_launches: int = MIN_LAUNCHES):
    """A timer (µs per launch, one graph replay a call) of a harness's `Timed`, and how many copies it rotates."""
    n = min(measure.rotations(t.stream_bytes), MAX_COPIES)
    copies = t.copies(n)

    def launches() -> None:
        for c in copies:
            t.call(c)

    replay = measure.graph_timer(launches, inner=max(1, math.ceil(min_launches / (n * t.launches))))
    return (lambda: replay() / n), n


def variant(k, x, peers, which: str):
    """The `Timed` of one baseline of harness k (the launch itself for "launch")."""
    if which == "launch":
        return k.timed(x, peers)
    if which == "separate":
        return k.separate().timed(x, peers)
    if which == "separate-pdl":
        return k.separate(pdl=True).timed(x, peers)
    if which == "torch":
        return k.stock(x, peers)
    if which == "compile":
        # every key's stock function is the same code: Dynamo's cache of it would guard the next key against
        # this one's (and past 8 keys stop compiling): a fresh cache per key (a step compiles each part on its
        # own: one graph of a step is too big; its harness's `compiled`)
        torch._dynamo.reset()
        t = k.compiled(x, peers)
        return replace(t, call=quiet_compile(t.call))
    raise ValueError(f"unknown baseline {which!r}")


# what torch.compile logs as it compiles and runs, at WARNING and below: Inductor's and Dynamo's notes on a GPU
# (autotuning, reductions split, graph breaks, recompiles: pages of them in bench's progress)
COMPILE_LOGGERS = ("torch._inductor", "torch._dynamo", "torch.fx.experimental.symbolic_shapes")


@contextmanager
def compile_quiet():
    """torch.compile's warnings held back inside: the loggers of COMPILE_LOGGERS at ERROR, Python warnings issued
    from torch._inductor or torch._dynamo ignored. Errors still show: a logged ERROR, and every exception (a
    failed compile raises as before). With TORCH_LOGS set, as it says (someone asked to see them)."""
    if os.environ.get("TORCH_LOGS"):
        yield
        return
    loggers = [logging.getLogger(n) for n in COMPILE_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(max(lg.getEffectiveLevel(), logging.ERROR))
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"torch\._(inductor|dynamo)(\.|$)")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def quiet_compile(fn):
    """fn (a torch.compile'd call: it compiles on its first calls) run inside compile_quiet. Only Python runs it:
    a graph replay, which bench times, never goes through it."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        with compile_quiet():
            return fn(*args, **kwargs)

    return call


def bench_key(
    weights,
    kind: str,
    tp: int,
    rows: int,
    knobs: dict | None,
    baselines=(),
    rounds: int = 15,
    seed: int = 0,
    copy_tb_s: float | None = None,
    trace: bool = False,
    context: int | None = None,
) -> dict:
    """`time_key` of a key given as before resolved keys (its callers: tests/gpu; checks.legacy_key)."""
    key = legacy_key(weights.spec.name, kind, tp, rows, knobs, "cuda", context)
    return time_key(weights, key, baselines, rounds, seed, copy_tb_s, trace)


def time_key(
    weights,
    key: ResolvedKey,
    baselines=(),
    rounds: int = 15,
    seed: int = 0,
    copy_tb_s: float | None = None,
    trace: bool = False,
    on_ranks: bool = False,
    log=None,
) -> dict:
    """One key's launch: µs (median of `rounds` graph replays), bytes, floor and % of the copy bandwidth, and
    each baseline timed in alternating rounds with it (ratio baseline / launch: above 1, the launch is faster).
    The separate launches are checked bit for bit against the launch first. `on_ranks` (`bench --gpus T`): then
    the key on T real ranks from the same input, its µs per launch beside the emulation's (tuning/bench_ranks.py),
    once this process has let go of everything it timed (rank 0 shares its GPU; the weights stay)."""
    row, x = _time_emulation(weights, key, baselines, rounds, seed, copy_tb_s, trace, log)
    if on_ranks:
        import gc

        x = x.to("cpu")
        gc.collect()  # the harnesses and graphs of the emulation's timing (a step's harness holds cycles)
        torch.cuda.empty_cache()
        r = time_on_ranks(key, x, rounds)
        row["ranks"] = r | {"ratio": r["us"] / row["us"]}
    return row


def _time_emulation(weights, key: ResolvedKey, baselines, rounds: int, seed: int, copy_tb_s, trace: bool, log=None):
    """time_key's row of the one-device launch and its baselines, and the input it timed (every harness, timer
    and graph it made dies with this call)."""

    kind, tp, rows, context = key.kind, key.tp, key.rows, key.context
    step = get_kind(kind).composite
    k = make_harness(weights, key, **load_harness(kind).BENCH_OPTIONS)
    x = k.inputs(key_seed(seed, key.name))[0]
    peers = k.peer_partials(x)
    out = k(x, peers)  # compiles; the peers' partials in place
    out = {n: t.clone() for n, t in out.items()}
    main = k.timed(x, peers)
    launch_timer, copies = timer_for(main)
    rounds_us = [launch_timer()]
    if log:  # the first figure as soon as it is there (a key's baselines and breakdown take longer)
        log(f"  {key.name}: first timed round {rounds_us[0]:.1f} µs")
    rounds_us += [launch_timer() for _ in range(rounds - 1)]
    us = sorted(rounds_us)[len(rounds_us) // 2]
    row = {
        "kind": kind,
        "tp": tp,
        "rows": rows,
        "context": context,
        "knobs": dict(k.knobs),
        "tasks": k.launch.table.n_tasks,
        "us": us,
        "rounds_us": rounds_us,
        "bytes": main.nbytes,
        "copies": copies,
        "rotates": main.what,
    }
    if copy_tb_s:
        row["floor_us"] = measure.floor_us(main.nbytes, copy_tb_s)
        row["pct_copy"] = 100 * row["floor_us"] / us
    if step:
        row |= step_breakdown(k, us, rounds, copy_tb_s)
    row["baselines"] = {}
    keep = []  # every harness and timer of the key lives until its end (a graph's buffers must outlive it)
    # the defaults' launch and the other schedule's last: each is another harness, with buffers of its own
    for which in sorted((b for b in baselines if b != "chain"), key=lambda b: b == "defaults" or b in SCHEDULES):
        if which == "defaults" or which in SCHEDULES:
            knobs = defaults(kind) if which == "defaults" else {"launch": which}
            kb = make_harness(weights, key.with_knobs(knobs), **load_harness(kind).BENCH_OPTIONS)
            theirs = {n: t.clone() for n, t in kb(x, peers).items()}
            t = kb.timed(x, peers)
            extra = {"knobs_equal": kb.knobs == k.knobs}
            if which in SCHEDULES:
                extra["bitwise_equal"] = outputs_equal(out, theirs)
        else:
            kb, extra = k, {}
            if which.startswith("separate"):  # its bits first, then the same stage launches timed
                sep = k.separate(pdl=which == "separate-pdl")
                extra = {"bitwise_equal": outputs_equal(out, {n: t.clone() for n, t in sep(x, peers).items()})}
                t = sep.timed(x, peers)
            else:
                t = variant(k, x, peers, which)
        base_timer, _ = timer_for(t)
        r = measure.ratio(*measure.ab_rounds(launch_timer, base_timer, rounds))
        row["baselines"][which] = {"us": r["b_us"], "ratio": r["ratio"], "ratio_ci": r["ratio_ci"]} | extra
        keep.append((kb, t, base_timer))
    # `chain`: a step's launches under the other value of its knob chain (the same harness), timed beside it
    for label, t in (k.schedules(x, peers) if "chain" in baselines else {}).items():
        base_timer, _ = timer_for(t)
        r = measure.ratio(*measure.ab_rounds(launch_timer, base_timer, rounds))
        row["baselines"][label] = {"us": r["b_us"], "ratio": r["ratio"], "ratio_ci": r["ratio_ci"]}
        keep.append((t, base_timer))
    if trace:
        row["trace"] = trace_key(k, x, peers)
    del keep
    torch.cuda.synchronize()
    return row, x


def step_breakdown(k, step_us: float, rounds: int, copy_tb_s: float | None) -> dict:
    """Where a timed step's time goes: each part's launch timed alone as bench times a launch (its weights
    rotated past the L2), their sum per kind and its share of the step, and the gaps (the step less the sum of
    its parts: below 0 where the chained launches overlap); tokens per second per rank."""
    parts = []
    for name, kind, t in k.timed_parts:
        timer, _ = timer_for(t)
        samples = [timer() for _ in range(max(3, rounds // 3))]
        parts.append({"part": name, "kind": kind, "us": sorted(samples)[len(samples) // 2], "bytes": t.nbytes})
        del timer  # its weight copies go with it
        torch.cuda.empty_cache()
    by_kind: dict[str, dict] = {}
    for p in parts:
        s = by_kind.setdefault(p["kind"], {"parts": 0, "us": 0.0, "bytes": 0})
        s["parts"] += 1
        s["us"] += p["us"]
        s["bytes"] += p["bytes"]
    for s in by_kind.values():
        s["share"] = s["us"] / step_us
        if copy_tb_s:
            s["pct_copy"] = 100 * measure.floor_us(s["bytes"], copy_tb_s) / s["us"]
    total = sum(p["us"] for p in parts)
    return {
        "parts": parts,
        "by_kind": by_kind,
        "parts_us": total,
        "gaps_us": step_us - total,
        "tokens_per_s": k.rows * 1e6 / step_us,
    }


def free_for_workers(weights: Weights) -> None:
    """This process's GPU memory given back before worker processes time a key with weights of their own (`bench
    --against`): the checkpoint-layout tensors made so far (they come back on demand) and the allocator's cache."""
    weights.drop_raw()
    gc.collect()
    torch.cuda.empty_cache()


def trace_key(k, x, peers) -> dict | None:
    """Where one launch's time goes (runtime/trace.py): per task type and per stage (the separate launches'
    grouping) the first claim, last publish, mean wait and work, and the critical path. Needs a launch with a
    traced build (`tracing`). A step (`model`): every part traced in one replay of the step (`step_trace`)."""

    if hasattr(k.launch, "parts"):
        return step_trace(k, x, peers)
    launch = k.launch
    if not hasattr(launch, "tracing"):
        return None  # no traced build of this kind yet (bench says so)
    launch.tracing = True
    try:
        k(x, peers)  # the first traced launch compiles
        _replay(k, x, peers)
        table, trace = launch.trace_record()
        s = summarize(table, trace)
    finally:
        launch.tracing = False
    # the launch as a Chrome trace (bench --perfetto gathers every key's; the command takes it out of the row)
    return s | {"stages": stage_rows(s, k.stages(k.knobs)), "perfetto": chrome_events(table, trace, 0, "launch")}


def _replay(k, x, peers) -> None:
    """The timed call replayed from a CUDA graph, as bench times it: a stage schedule's launches (a step's
    parts) queued back to back, not each after the host's Python (about 100 µs a launch)."""
    t = k.timed(x, peers)
    w = t.copies(1)[0]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        t.call(w)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    del graph


def stage_rows(s: dict, stages) -> list[dict]:
    """A traced launch's task types grouped as its kind's stages: each stage's tasks, first claim, last publish,
    mean wait and work."""

    out = []
    for group in stages:
        names = [name_of(int(t)) for t in group]
        parts = [s["types"][n] for n in names if n in s["types"]]
        if parts:
            out.append(
                {
                    "stage": "+".join(names),
                    "tasks": sum(p["n"] for p in parts),
                    "first_claim": min(p["first_claim"] for p in parts),
                    "last_done": max(p["last_done"] for p in parts),
                    "wait": sum(p["wait"] * p["n"] for p in parts) / sum(p["n"] for p in parts),
                    "work": sum(p["work"] * p["n"] for p in parts) / sum(p["n"] for p in parts),
                }
            )
    return out


def path_by_stage(s: dict, stages) -> dict[str, float]:
    """µs of a traced launch's critical path in each of its kind's stages: each step's work (ready to publish)
    and the hand-off before it, to the stage of its task type ("other" for a type in none)."""

    stage_of = {name_of(int(t)): "+".join(name_of(int(u)) for u in g) for g in stages for t in g}
    out: dict[str, float] = {}
    for step in s["critical_path"]:
        us = step["done"] - step["ready"] + max(step.get("handoff", 0.0), 0.0)
        name = stage_of.get(step["type"], "other")
        out[name] = out.get(name, 0.0) + us
    return out


def step_trace(k, x, peers) -> dict:
    """Where a step's time goes, launch by launch: every part with a traced build traced in one graph replay of
    the step; per part its traced µs (first claim to last publish) and the stage that holds its critical path
    (`path_by_stage`); per kind the mean of its parts and the stage that holds the most of their paths: which
    layer kind and which stage a missed target waits on."""

    traced = [(n, h) for n, h in k.launch.parts if hasattr(h.launch, "tracing")]
    for _, h in traced:
        h.launch.tracing = True
    try:
        k(x, peers)  # the traced builds compile
        _replay(k, x, peers)
        parts, records = [], [(name, h, *h.launch.trace_record()) for name, h in traced]
        t0 = min(int(trace[:, 0].min()) for *_, trace in records)  # one replay: the parts share a clock
        events = []
        for i, (name, h, table, trace) in enumerate(records):
            s = summarize(table, trace)
            path = path_by_stage(s, h.stages(h.knobs))
            holds = max(path, key=path.get)
            parts.append({"part": name, "kind": h.kind, "us": s["end_us"], "path": path, "holds": holds})
            events += chrome_events(table, trace, i, f"{name} ({h.kind})", t0)
    finally:
        for _, h in traced:
            h.launch.tracing = False
    return {"parts": parts, "by_kind": step_kinds(parts), "perfetto": events}


def step_kinds(parts: list[dict]) -> dict[str, dict]:
    """A step trace's parts summed per kind: parts, mean traced µs, and the stage holding the most of their
    critical paths with its mean µs there and its share of the kind's mean path."""
    out = {}
    for kind in dict.fromkeys(p["kind"] for p in parts):
        mine = [p for p in parts if p["kind"] == kind]
        path: dict[str, float] = {}
        for p in mine:
            for stage, us in p["path"].items():
                path[stage] = path.get(stage, 0.0) + us / len(mine)
        holds = max(path, key=path.get)
        out[kind] = {
            "parts": len(mine),
            "us": sum(p["us"] for p in mine) / len(mine),
            "holds": holds,
            "holds_us": path[holds],
            "holds_share": path[holds] / sum(path.values()),
        }
    return out


def _compile(job: tuple) -> str:
    """One key's kernels compiled into Triton's cache (and Inductor's, for baselines that use torch.compile), in
    a worker process: the launch's (and its peers') at its resolved key, then each baseline run once."""
    full, baselines = job

    with kernel_cache.counting(full.name):
        return _compile_key(full, baselines)


def _compile_key(full, baselines) -> str:
    kind, tp, rows = full.kind, full.tp, full.rows

    spec = load_model(full.model)
    step = get_kind(kind).composite
    # a step's other chain (`--baseline chain`) is timed inside a graph capture: compiled here first (a launch
    # chained by PDL is another build: asked for only, it is not half of every step key's compile)
    chains = step and "chain" in baselines
    variants = [full.with_knobs({"chain": c}) for c in kind_knobs(kind)["chain"].values] if chains else [full]
    variants += [full.with_knobs({"launch": b}) for b in baselines if b in SCHEDULES]
    for ks in variants:
        for _, la in build_launches(spec, ks):
            args = on_device(la.placeholder_args(), "cuda")
            la.kernel.warmup(**args, **la.constexprs(), **la.options(), grid=(la.grid,))
    # a step's baselines need every layer's weights: too much for each of several workers (compiled at bench)
    others = [b for b in baselines if b not in ("defaults", "chain") and b not in SCHEDULES] if not step else []
    if others:
        k = make_harness(Weights(spec, seed=0, device="cuda"), full)
        x = k.inputs(0)[0]
        peers = k.peer_partials(x)
        for b in others:
            t = variant(k, x, peers, b)
            t.call(t.copies(1)[0])
    torch.cuda.synchronize()
    return f"{kind} TP{tp} r{rows}"


def precompile(jobs: list[tuple], workers: int, log=None) -> None:
    """Compile many keys' kernels at once, in `workers` processes sharing Triton's (and Inductor's) on-disk
    caches, before anything is timed: a launch compiles in seconds to tens of seconds, serially the larger
    part of a tune or a bench. jobs: (resolved key, baselines as a tuple)."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    jobs = list(dict.fromkeys(jobs))  # hashable: knobs and baselines as tuples
    if workers <= 1 or len(jobs) <= 1:
        return
    start = time.monotonic()
    ctx = multiprocessing.get_context("spawn")  # CUDA in each worker
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as pool:
        list(pool.map(_compile, jobs))
    if log:
        log(f"  compiled {len(jobs)} launches in {time.monotonic() - start:.0f} s ({workers} processes)")


def compile_workers() -> int:
    """Compile processes: the cores but two (one for the timing process, one for the system)."""
    return max(1, (os.cpu_count() or 2) - 2)


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def environment_ok() -> None:
    """bench and tune time on a GPU: without one, a clear error (exit 2)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available():
        raise measure.NeedsGPU(
            f"timing needs a CUDA GPU; torch {torch.__version__} sees none",
            hint="run bench and tune on a GPU machine (the interpreter's times mean nothing)",
        )
