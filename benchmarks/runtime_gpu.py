"""GPU evidence for the launch runtime with `embed` and `tail` at glm53_flash sizes (issue 4).

Run on the GPU machine from the repository root:  PYTHONUNBUFFERED=1 python3 benchmarks/runtime_gpu.py OUT_DIR
Checks (accuracy against the reference on the GPU, bitwise across grids and schedule knobs, three launches
and CUDA-graph replays without a host reset, every site stuck in turn), then times: the device-to-device
copy bandwidth, `tail` and `embed` per launch (CUDA graph of N launches, median of rounds), and one
hand-off by flag and by box (a chain of dependent no-op tasks). Writes results.json; prints a table.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import torch
import triton

from glm53ctl.kernels.launches import KindLaunch
from glm53ctl.kernels.reference import Reference
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.chain import ChainLaunch
from glm53ctl.kernels.spec import load_model
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


def rel_rms(ref, out):
    if torch.isnan(out).any():
        return float("inf")
    ref, out = ref.double(), out.double()
    return float((out - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt())


def graph_time(fn, inner=20, rounds=21):
    """µs per call: a CUDA graph of `inner` calls, replayed `rounds` times; median, and all rounds."""
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
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    return statistics.median(times), times


def copy_bandwidth():
    n = 2 * 1024**3 // 2
    src = torch.randn(n // 2, device=DEV).to(torch.bfloat16).repeat(2)
    dst = torch.empty_like(src)
    us, _ = graph_time(lambda: dst.copy_(src), inner=5, rounds=15)
    return 2 * src.numel() * 2 / (us * 1e-6) / 1e12, us  # TB/s (read + write)


def tail_bytes(spec, tp, rows):
    D, vl = spec.hidden, spec.shards(tp).vocab
    return vl * D * 2 + rows * 4 * D * 2 + (tp - 1) * rows * vl * 4 + rows * vl * tp * 4


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_model("glm53_flash")
    w = DeviceWeights(spec)
    props = torch.cuda.get_device_properties(DEV)
    env = {
        "gpu": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "python": platform.python_version(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_sha": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    }
    res = {"env": env, "checks": [], "timings": [], "hops": [], "faults": []}
    print(json.dumps(env), flush=True)

    bw, copy_us = copy_bandwidth()
    res["copy"] = {"tb_s": bw, "us_per_2GiB": copy_us}
    print(f"copy bandwidth {bw:.3f} TB/s", flush=True)

    for kind in ("tail", "embed"):
        for tp in (4, 8):
            for rows in (1, 8):
                t0 = time.time()
                ref_model = Reference(w, tp)
                base = KindLaunch(w, kind, tp, rows, {}, DEV)
                x = base.inputs(seed=tp * 10 + rows)[0].to(DEV)
                peers = base.peer_partials(x)
                out = base(x, peers)
                ref = ref_model.embed(x) if kind == "embed" else ref_model.tail(x.float())
                errs = {n: rel_rms(ref[n], out[n]) for n in out}
                bitwise = {}
                # grids and every schedule knob value: the same bits
                variants = [{"grid": 1}, {"grid": 3}, {"grid": 264}, {"handoff": "box"}, {"poll": 0}, {"warps": 8}]
                variants += [{"block_n": 32}, {"block_n": 128}] if kind == "tail" else [{"chunk": 256}]
                for v in variants:
                    k = KindLaunch(w, kind, tp, rows, v, DEV)
                    o = k(x, peers)
                    bitwise[json.dumps(v)] = all(torch.equal(o[n], out[n]) for n in out)
                again = [base(x, peers) for _ in range(3)]
                three = all(torch.equal(a[n], out[n]) for a in again for n in out)
                graph_out = {}

                def step():
                    graph_out.update(base(x, peers, check=False))

                us, rounds = graph_time(step)
                base.launch.runtime.check()
                graph_same = all(torch.equal(graph_out[n], out[n]) for n in out)
                row = {"kind": kind, "tp": tp, "rows": rows, "rel_rms": errs, "bitwise": bitwise,
                       "three_launches_equal": three, "graph_replays_equal": graph_same, "us": us, "rounds": rounds}
                if kind == "tail":
                    nbytes = tail_bytes(spec, tp, rows)
                    row |= {"bytes": nbytes, "tb_s": nbytes / (us * 1e-6) / 1e12}
                    row["pct_copy"] = 100 * row["tb_s"] / bw
                    row["floor_us"] = nbytes / (bw * 1e12) * 1e6
                res["checks"].append(row)
                print(f"{kind} TP{tp} rows{rows}: err {errs} bitwise {all(bitwise.values())} three {three} "
                      f"graph {graph_same} {us:.1f} us {row.get('pct_copy', 0):.1f}% ({time.time() - t0:.0f}s)",
                      flush=True)

    # knob sweep for tail's speed (schedule knobs only change time)
    for tp in (4, 8):
        for rows in (1, 8):
            for v in [{}, {"block_n": 32}, {"block_n": 128}, {"block_k": 256}, {"block_k": 64}, {"warps": 8},
                      {"handoff": "box"}, {"poll": 0}, {"grid": 264}, {"block_n": 128, "warps": 8}]:
                k = KindLaunch(w, "tail", tp, rows, v, DEV)
                x = k.inputs(seed=1)[0].to(DEV)
                peers = k.peer_partials(x)
                us, _ = graph_time(lambda: k(x, peers, check=False))
                nbytes = tail_bytes(spec, tp, rows)
                res["timings"].append({"tp": tp, "rows": rows, "knobs": v, "us": us,
                                       "pct_copy": 100 * nbytes / (us * 1e-6) / 1e12 / bw})
                print(f"tail TP{tp} rows{rows} {v}: {us:.1f} us {res['timings'][-1]['pct_copy']:.1f}%", flush=True)

    # one hand-off: a chain of dependent no-op tasks
    for handoff in ("flag", "box"):
        for poll in (0, 1):
            n = 4096
            c = ChainLaunch(n, handoff, poll, props.multi_processor_count, DEV)
            c()
            us, _ = graph_time(lambda: c(check=False), inner=5, rounds=11)
            c.runtime.check()
            res["hops"].append({"handoff": handoff, "poll": poll, "hops": n, "us_per_hop": us / n})
            print(f"hop {handoff} poll{poll}: {us / n:.3f} us", flush=True)

    # every site stuck in turn: named within its budget, no hang, and the next launch gives the clean bits
    for kind, tp, rows in (("tail", 4, 1), ("tail", 8, 2), ("embed", 4, 1), ("embed", 8, 2)):
        k = KindLaunch(w, kind, tp, rows, {}, DEV)
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
        res["faults"].append({"kind": kind, "tp": tp, "rows": rows, "sites": sites, "named": named,
                              "retries_equal": equal, "hangs": sites - named, "budget_ms": 2,
                              "worst_fault_s": worst, "seconds": time.time() - t0})
        print(f"fault {kind} TP{tp} rows{rows}: {named}/{sites} named, {equal} retries equal, "
              f"worst {worst * 1e3:.1f} ms", flush=True)

    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    print("\n| kind | TP | rows | µs | % copy BW | rel RMS | bitwise grids/knobs | 3 launches | graph |")
    for r in res["checks"]:
        print(f"| {r['kind']} | {r['tp']} | {r['rows']} | {r['us']:.1f} | {r.get('pct_copy', float('nan')):.1f} | "
              f"{max(r['rel_rms'].values()):.2e} | {all(r['bitwise'].values())} | {r['three_launches_equal']} | "
              f"{r['graph_replays_equal']} |")
    for h in res["hops"]:
        print(f"hop {h['handoff']} poll {h['poll']}: {h['us_per_hop']:.3f} µs")
    print(f"copy {bw:.3f} TB/s")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out"))
