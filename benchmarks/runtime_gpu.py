"""GPU evidence for the launch runtime with `embed` and `tail` at glm53_flash sizes (issue 4).

Run on the GPU machine from the repository root:  PYTHONUNBUFFERED=1 python3 benchmarks/runtime_gpu.py OUT_DIR
Checks (accuracy against the reference on the GPU, bitwise across grids and schedule knobs, three launches
and CUDA-graph replays without a host reset, every site stuck in turn), then times: the device-to-device
copy bandwidth, `tail` and `embed` per launch (CUDA graph of N launches, median of rounds), and one
hand-off by flag and by box (a chain of dependent no-op tasks). Writes results.json; prints a table.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.gemv import gemv_tile
from glm53ctl.kernels.launches import KindLaunch
from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.reference import Reference
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.chain import ChainLaunch
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.tail.kernel import _lm_head_folded
from glm53ctl.kernels.weights import ROOT

DEV = torch.device("cuda")


class DeviceWeights:
    """Random weights made on the GPU (CPU generation of two 634M-entry tables would take minutes).
    The same interface as Weights.shard for the tensors embed and tail read."""

    def __init__(self, spec, seed=0):
        self.spec = spec
        g = torch.Generator(device=DEV).manual_seed(seed)
        V, D = spec.model.vocab_size, spec.hidden
        self.full = {
            f"{ROOT}embed_tokens.weight": torch.randn(V, D, generator=g, device=DEV).to(torch.bfloat16),
            "lm_head.weight": (torch.randn(V, D, generator=g, device=DEV) / D**0.5).to(torch.bfloat16),
            f"{ROOT}norm.weight": (1 + 0.1 * torch.randn(D, generator=g, device=DEV)).to(torch.bfloat16),
        }

    def shard(self, name, rank=0, tp=1):
        t = self.full[name]
        return t if t.dim() == 1 else t.chunk(tp, dim=0)[rank].contiguous()


def capture_graph(fn, inner=20):
    """A CUDA graph of `inner` calls of fn (captured on a side stream after one warm call), replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_time(fn, inner=20, rounds=21):
    """µs per call: a CUDA graph of `inner` calls, replayed `rounds` times; median, and all rounds."""
    g = capture_graph(fn, inner)
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    return statistics.median(times), times


_COPY = {}


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + o, tl.load(src + o, mask=o < n), mask=o < n)


@triton.jit
def _plain_gemv(x, w, y, R, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The same GEMV tile as one ordinary launch (one program per tile): what the tile alone reaches."""
    n0 = tl.program_id(0) * BLOCK_N
    acc = gemv_tile(x, K, w, n0, R, N, K, K, BLOCK_N, BLOCK_K, False)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(y + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


@triton.jit
def _plain_fold(
    H, w, y, R, N, D: tl.constexpr, HC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, M: tl.constexpr
):
    """The folded lm_head GEMV tile (H's stream rows against w') as one ordinary launch."""
    n0 = tl.program_id(0) * BLOCK_N
    acc = _lm_head_folded(H, w, n0, R, D, HC, tl.minimum(n0 + BLOCK_N, N), BLOCK_N, BLOCK_K, M, False)
    o_m = tl.arange(0, M // HC)
    o_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(y + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


def launch_only(k, x, peers):
    """The launch alone, writing into fixed output buffers (what a timing graph should hold), and its outputs.
    KindLaunch's call also copies ĥ out of the launch's buffer for the checks: a second kernel in the graph
    that earlier tail timings included (about 3 µs)."""
    if k.kind == "tail":
        out = torch.empty(k.rows, k.launch.width, device=DEV)
        return (
            lambda: k.launch(x, k.norm, k.shards[0], peers, out=out, check=False),
            lambda: {"h_hat": k.launch.h_hat[: k.rows], "logits": out},
        )
    out = torch.empty(k.rows, k.spec.mhc.streams, k.spec.hidden, dtype=torch.bfloat16, device=DEV)
    return lambda: k.launch(x, k.shards[0], peers, out=out, check=False), lambda: {"H": out}


def diagnose(out_dir: Path) -> None:
    """Where TP8's tail spends its time, rows 1 and 8: the full launch, its partial launch (no gathers), other
    knobs, and the plain GEMV tiles (ĥ rows, or H's stream rows as the folded GEMV reads them)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_model("glm53_flash")
    w = DeviceWeights(spec)
    res = {"env": environment(), "rows": []}
    warm_clocks()
    bw, _ = copy_bandwidth()
    res["copy_tb_s"] = bw
    best = {"stages": 3, "norm": "fold", "split": "even", "gathers": "last"}
    D, HC, vl = spec.hidden, spec.mhc.streams, spec.shards(8).vocab
    for rows in (1, 8):

        def add(what, us):
            res["rows"].append({"rows": rows, "what": what, "us": us})
            print(f"TP8 rows{rows} {what}: {us:.1f} us", flush=True)

        import glm53ctl.kernels.tail.kernel as tail_kernel

        for name, v, spare_every in (
            ("best", best, 16),
            ("best, spare 1/8", best, 8),
            ("best, spare 1/32", best, 32),
            ("best, spare 0", best, 10**6),
            ("gathers first", {**best, "gathers": "first"}, 16),
        ):
            tail_kernel.SPARE_EVERY = spare_every
            k = KindLaunch(w, "tail", 8, rows, v, DEV)
            x = k.inputs(seed=1)[0].to(DEV)
            peers = k.peer_partials(x)
            add(name, graph_time(launch_only(k, x, peers)[0])[0])
            if name == "best":
                add(
                    "best, as KindLaunch calls it (with its copy of ĥ)", graph_time(lambda: k(x, peers, check=False))[0]
                )
            if name == "best":
                for grid in (396, 396 - 396 // 16):
                    p = KindLaunch(w, "tail", 8, rows, {**best, "grid": grid}, DEV).peers[0]
                    add(
                        f"best, partial launch (no gathers), grid {grid}",
                        graph_time(lambda: p(x, k.norm, k.shards[1], check=False))[0],
                    )
        tail_kernel.SPARE_EVERY = 16
        wt = w.shard("lm_head.weight", 0, 8)
        xx = torch.randn(rows, D, device=DEV).to(torch.bfloat16)
        hh = torch.randn(rows, HC, D, device=DEV).to(torch.bfloat16)
        yy = torch.empty(rows, vl, device=DEV)
        M = 16 if rows * HC <= 16 else 32
        for ns in (3,):
            add(
                f"plain GEMV on ĥ rows, stages {ns}",
                graph_time(
                    lambda: _plain_gemv[(triton.cdiv(vl, 64),)](xx, wt, yy, rows, vl, D, 64, 128, num_stages=ns)
                )[0],
            )
            add(
                f"plain folded GEMV on H's stream rows (M {M}), stages {ns}",
                graph_time(
                    lambda: _plain_fold[(triton.cdiv(vl, 64),)](hh, wt, yy, rows, vl, D, HC, 64, 128, M, num_stages=ns)
                )[0],
            )
    (out_dir / "diagnose.json").write_text(json.dumps(res, indent=2))
    print(f"copy {bw:.3f} TB/s")


def copy_bandwidth():
    """TB/s of a 2 GiB device-to-device copy (bytes read + written), median of graph rounds."""
    if not _COPY:
        _COPY["src"] = torch.randn(2**29, device=DEV).to(torch.bfloat16).repeat(2)
        _COPY["dst"] = torch.empty_like(_COPY["src"])
    src, dst = _COPY["src"], _COPY["dst"]
    n = src.numel()
    # the best of three copies: cudaMemcpy (torch copy_), an elementwise kernel, a 16-byte Triton copy
    ways = {
        "copy_": lambda: dst.copy_(src),
        "mul": lambda: torch.mul(src, 1, out=dst),
        "triton": lambda: _copy_kernel[(triton.cdiv(n, 8192),)](src, dst, n, BLOCK=8192, num_warps=8),
    }
    got = {name: graph_time(fn, inner=5, rounds=15)[0] for name, fn in ways.items()}
    us = min(got.values())
    _COPY.setdefault("ways", []).append({k: 2 * n * 2 / (v * 1e-6) / 1e12 for k, v in got.items()})
    return 2 * n * 2 / (us * 1e-6) / 1e12, us


def warm_clocks(seconds=1.5):
    """The SM clock idles low: keep the GPU busy a while before anything is timed."""
    a = torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16)
    t = time.time()
    while time.time() - t < seconds:
        a @ a
    torch.cuda.synchronize()


def tail_bytes(spec, tp, rows):
    D, vl = spec.hidden, spec.shards(tp).vocab
    return vl * D * 2 + rows * 4 * D * 2 + (tp - 1) * rows * vl * 4 + rows * vl * tp * 4


def environment() -> dict:
    """The GPU, driver, CUDA, torch, Triton and Python versions, the date and the git sha (DESIGN.md §8)."""
    props = torch.cuda.get_device_properties(DEV)
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "driver": subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
        ).stdout.strip(),
        "python": platform.python_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        # the device machine's copy of the tree may carry a stale .git: the caller passes the sha it ran, typed
        # in on its own machine (`$(git rev-parse HEAD)` run on the device gives the stale one)
        "git_sha": os.environ.get("GIT_SHA")
        or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "code_digest": code_digest(),
    }


def code_digest() -> str:
    """sha256 of the code a run executes (kernels/, tuning/, benchmarks/ *.py, by path and content): it names the
    run's code whatever the device copy's git says; `python3 benchmarks/runtime_gpu.py --digest` prints it here."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(p for d in ("kernels", "tuning", "benchmarks") for p in (root / d).rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_model("glm53_flash")
    w = DeviceWeights(spec)
    env = environment()
    res = {"env": env, "checks": [], "timings": [], "hops": [], "faults": []}
    print(json.dumps(env), flush=True)

    warm_clocks()
    bw, copy_us = copy_bandwidth()
    res["copy"] = {"tb_s": bw, "us_per_2GiB": copy_us}
    print(f"copy bandwidth {bw:.3f} TB/s", flush=True)

    # tail's knobs first: the best config by geometric mean over the four keys becomes the checked one
    # the GEMV tile alone, as plain launches: what the persistent launch should approach
    for tp in (4, 8):
        for rows in (1, 8):
            vl = spec.shards(tp).vocab
            wt = w.shard("lm_head.weight", 0, tp)
            xx = torch.randn(rows, spec.hidden, device=DEV).to(torch.bfloat16)
            yy = torch.empty(rows, vl, device=DEV)
            for bn, bk, nw, ns in ((64, 128, 4, 4), (32, 256, 4, 3)):
                us, _ = graph_time(
                    lambda: _plain_gemv[(triton.cdiv(vl, bn),)](
                        xx, wt, yy, rows, vl, spec.hidden, bn, bk, num_warps=nw, num_stages=ns
                    )
                )
                res.setdefault("plain_gemv", []).append(
                    {
                        "tp": tp,
                        "rows": rows,
                        "block_n": bn,
                        "block_k": bk,
                        "warps": nw,
                        "stages": ns,
                        "us": us,
                        "tb_s": vl * spec.hidden * 2 / (us * 1e-6) / 1e12,
                    }
                )
                print(
                    f"plain gemv TP{tp} rows{rows} bn{bn} bk{bk} w{nw} s{ns}: {us:.1f} us "
                    f"{res['plain_gemv'][-1]['tb_s']:.2f} TB/s",
                    flush=True,
                )

    base = {"block_n": 64, "block_k": 128, "stages": 4, "grid": 396, "handoff": "box"}
    fold = {**base, "norm": "fold"}
    even = {**fold, "split": "even", "gathers": "last"}
    candidates = [
        {**base, "norm": "task", "split": "tiles", "gathers": "first"},
        {**fold, "split": "tiles", "gathers": "last"},
        even,
        {**even, "stages": 3},
    ]
    if "--defaults" in sys.argv:  # the registry's defaults only (with --sweep: a quick figure at HEAD)
        candidates = [{}]
    score = {i: 1.0 for i in range(len(candidates))}
    for tp in (4, 8):
        for rows in (1, 8):
            bw_here, _ = copy_bandwidth()
            for i, v in enumerate(candidates):
                k = KindLaunch(w, "tail", tp, rows, v, DEV)
                x = k.inputs(seed=1)[0].to(DEV)
                peers = k.peer_partials(x)
                us, _ = graph_time(launch_only(k, x, peers)[0])
                nbytes = tail_bytes(spec, tp, rows)
                pct = 100 * nbytes / (us * 1e-6) / 1e12 / bw_here
                score[i] *= us
                res["timings"].append(
                    {"tp": tp, "rows": rows, "knobs": v, "us": us, "pct_copy": pct, "copy_tb_s": bw_here}
                )
                print(f"tail TP{tp} rows{rows} {v}: {us:.1f} us {pct:.1f}% (copy {bw_here:.2f} TB/s)", flush=True)
    best = candidates[min(score, key=score.get)]
    res["best_tail_knobs"] = best
    print(f"best tail knobs: {best}", flush=True)
    if "--sweep" in sys.argv:  # the timings only
        (out_dir / "runtime.json").write_text(json.dumps(res, indent=2, default=float))
        return

    for kind in ("tail", "embed"):
        for tp in (4, 8):
            for rows in (1, 8):
                t0 = time.time()
                ref_model = Reference(w, tp)
                chosen = best if kind == "tail" else {}
                bw_here, _ = copy_bandwidth()
                base = KindLaunch(w, kind, tp, rows, chosen, DEV)
                x = base.inputs(seed=tp * 10 + rows)[0].to(DEV)
                peers = base.peer_partials(x)
                out = base(x, peers)
                ref = ref_model.embed(x) if kind == "embed" else ref_model.tail(x.float())
                errs = {n: rel_rms(ref[n], out[n]) for n in out}
                if kind == "tail":  # `norm` is numeric: its other values against the reference too
                    for other in ({"norm": v} for v in ("task", "fold") if v != chosen.get("norm")):
                        o = KindLaunch(w, kind, tp, rows, {**chosen, **other}, DEV)(x, peers)
                        errs |= {f"{n} {json.dumps(other)}": rel_rms(ref[n], o[n]) for n in o}
                bitwise = {}
                # grids and every schedule knob value: the same bits
                variants = [
                    {"grid": 1},
                    {"grid": 3},
                    {"grid": 132},
                    {"grid": 264},
                    {"handoff": "box"},
                    {"handoff": "flag"},
                    {"poll": 0},
                    {"poll": 1},
                    {"warps": 4},
                    {"warps": 8},
                ]
                variants += (
                    [
                        {"block_n": 32},
                        {"block_n": 64},
                        {"block_n": 128},
                        {"stages": 2},
                        {"stages": 4},
                        {"prefetch": 1},
                        {"gathers": "last"},
                        {"split": "even"},
                        {"split": "tiles"},
                    ]
                    if kind == "tail"
                    else [{"chunk": 256}, {"chunk": 512}]
                )
                for v in variants:
                    k = KindLaunch(w, kind, tp, rows, {**chosen, **v}, DEV)
                    o = k(x, peers)
                    bitwise[json.dumps(v)] = all(torch.equal(o[n], out[n]) for n in out)
                again = [base(x, peers) for _ in range(3)]
                three = all(torch.equal(a[n], out[n]) for a in again for n in out)
                step, graph_out = launch_only(base, x, peers)
                us, rounds = graph_time(step)
                base.launch.runtime.check()
                graph_same = all(torch.equal(graph_out()[n], out[n]) for n in out)
                row = {
                    "kind": kind,
                    "tp": tp,
                    "rows": rows,
                    "knobs": chosen,
                    "copy_tb_s": bw_here,
                    "rel_rms": errs,
                    "bitwise": bitwise,
                    "three_launches_equal": three,
                    "graph_replays_equal": graph_same,
                    "us": us,
                    "rounds": rounds,
                }
                if kind == "tail":
                    nbytes = tail_bytes(spec, tp, rows)
                    row |= {"bytes": nbytes, "tb_s": nbytes / (us * 1e-6) / 1e12}
                    row["pct_copy"] = 100 * row["tb_s"] / bw_here
                    row["floor_us"] = nbytes / (bw_here * 1e12) * 1e6
                res["checks"].append(row)
                print(
                    f"{kind} TP{tp} rows{rows}: err {errs} bitwise {all(bitwise.values())} three {three} "
                    f"graph {graph_same} {us:.1f} us {row.get('pct_copy', 0):.1f}% ({time.time() - t0:.0f}s)",
                    flush=True,
                )

    # one hand-off: a chain of dependent no-op tasks
    for handoff in ("flag", "box"):
        for poll in (0, 1):
            n = 4096
            c = ChainLaunch(n, handoff, poll, env["sms"], DEV)
            c()
            us, _ = graph_time(lambda: c(check=False), inner=5, rounds=11)
            c.runtime.check()
            res["hops"].append({"handoff": handoff, "poll": poll, "hops": n, "us_per_hop": us / n})
            print(f"hop {handoff} poll{poll}: {us / n:.3f} us", flush=True)

    # every site stuck in turn: named within its budget, no hang, and the next launch gives the clean bits
    for kind, tp, rows in (("tail", 4, 1), ("tail", 8, 2), ("embed", 4, 1), ("embed", 8, 2)):
        k = KindLaunch(w, kind, tp, rows, best if kind == "tail" else {}, DEV)
        x = k.inputs(seed=3)[0].to(DEV)
        peers = k.peer_partials(x)
        clean = k(x, peers)
        sites = len(k.launch.table.sites)
        named = equal = 0
        worst = 0.0
        t0 = time.time()
        for s in range(sites):
            t = time.time()
            try:
                k(x, peers, stuck_site=s, budget_ns=2_000_000)
            except LaunchFault as e:
                named += e.site == s
            worst = max(worst, time.time() - t)
            o = k(x, peers)
            equal += all(torch.equal(o[n], clean[n]) for n in clean)
        res["faults"].append(
            {
                "kind": kind,
                "tp": tp,
                "rows": rows,
                "sites": sites,
                "named": named,
                "retries_equal": equal,
                "hangs": sites - named,
                "budget_ms": 2,
                "worst_fault_s": worst,
                "seconds": time.time() - t0,
            }
        )
        print(
            f"fault {kind} TP{tp} rows{rows}: {named}/{sites} named, {equal} retries equal, worst {worst * 1e3:.1f} ms",
            flush=True,
        )

    res["copy_ways"] = _COPY["ways"]
    # a faulted launch nobody checked (as in a graph replay): the next launch must still be clean
    for kind in ("tail", "embed"):
        k = KindLaunch(w, kind, 4, 2, best if kind == "tail" else {}, DEV)
        x = k.inputs(seed=5)[0].to(DEV)
        peers = k.peer_partials(x)
        clean = k(x, peers, poison=True)
        k(x, peers, stuck_site=0, budget_ns=2_000_000, check=False)
        after = k(x, peers, poison=True, check=False)
        equal = all(torch.equal(clean[n], after[n]) for n in clean)
        try:
            k.launch.runtime.check()
            reported = None
        except LaunchFault as e:
            reported = e.site
        res.setdefault("unchecked_fault", []).append(
            {"kind": kind, "next_launch_equal": equal, "reported_site": reported}
        )
        print(f"unchecked fault {kind}: next launch equal {equal}, host told of site {reported}", flush=True)

    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    print("\n| kind | TP | rows | µs | floor µs | % copy BW | rel RMS | bitwise grids/knobs | 3 launches | graph |")
    for r in res["checks"]:
        print(
            f"| {r['kind']} | {r['tp']} | {r['rows']} | {r['us']:.1f} | {r.get('floor_us', float('nan')):.1f} | "
            f"{r.get('pct_copy', float('nan')):.1f} | "
            f"{max(r['rel_rms'].values()):.2e} | {all(r['bitwise'].values())} | {r['three_launches_equal']} | "
            f"{r['graph_replays_equal']} |"
        )
    for h in res["hops"]:
        print(f"hop {h['handoff']} poll {h['poll']}: {h['us_per_hop']:.3f} µs")
    for f in res["faults"]:
        print(
            f"fault {f['kind']} TP{f['tp']} rows {f['rows']}: {f['named']}/{f['sites']} named, hangs {f['hangs']}, "
            f"retries equal {f['retries_equal']}, worst {f['worst_fault_s'] * 1e3:.1f} ms"
        )
    print(f"copy {bw:.3f} TB/s; best tail knobs {best}; copy ways {_COPY['ways'][0]}")


if __name__ == "__main__":
    if "--digest" in sys.argv:
        print(code_digest())
        sys.exit(0)
    if "--diagnose" in sys.argv:
        diagnose(Path(sys.argv[1]))
        sys.exit()
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out"))
