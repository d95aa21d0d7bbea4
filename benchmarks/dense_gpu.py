"""GPU evidence for the `dense` launch at glm53_flash per-rank sizes (issue 7).

Run on the GPU machine from the repository root:  PYTHONUNBUFFERED=1 python3 benchmarks/dense_gpu.py OUT_DIR
For TP 1/2/4/8 × rows 1/2/4/8: accuracy of every output and state write against the reference (fp32, on
the GPU), bitwise equality across grids, repeated launches and CUDA-graph replays; the schedule knobs
bitwise on two keys; then µs per launch (a CUDA graph of launches over three rotated weight copies, median
of rounds) for the persistent launch, the same task bodies as separate launches (one per stage) in one
graph, and the reference in bf16 in one graph, beside the bytes moved, the floor at the copy bandwidth
measured in the same run and % of it; then every site stuck in turn on two keys. Writes results.json.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from runtime_gpu import DEV, _copy_kernel, capture_graph, copy_bandwidth, environment, graph_time, warm_clocks

TPS, ROWS = (1, 2, 4, 8), (1, 2, 4, 8)
BITWISE_KEYS = ((4, 1), (8, 2))


def schedule_variants() -> tuple[dict, ...]:
    """Every value but dense's default of every schedule knob in the registry; grid only 132 and 264 (0 is 396
    on an H200) and stages only 2 (a compile option, as the other values)."""
    from glm53ctl.tuning.knobs import KNOBS

    out = [{"grid": 132}, {"grid": 264}, {"stages": 2}]
    for k in KNOBS.values():
        if "dense" in k.kinds and k.cls == "schedule" and k.name not in ("grid", "stages"):
            out += [{k.name: v} for v in k.values if v != k.default_for("dense")]
    return tuple(out)


VARIANTS = schedule_variants()
# the defaults; prefetch 0 (the default before dense's prefetch 3); oproj_first; the norm both ways (norm auto
# folds at rows <= 4); 3 programs per SM (maxnreg 168: slower at rows 1, faster at rows 8 in the traces); the
# FFN mix made by the attention reduces (ffn_mix auto makes tasks of it at rows <= 4)
TIMED = ({}, {"prefetch": 0}, {"oproj_first": 1}, {"norm": "task"}, {"norm": "fold"}, {"maxnreg": 168})
TIMED += ({"ffn_mix": "reduce"},)
COPIES = 3


def _compile(job):
    """Compile (no launch) one key's persistent and separate-launch kernels into the shared Triton cache."""
    tp, rows, knobs, with_stages = job[:4]
    traced = len(job) > 4 and job[4]  # also the traced build (trace_keys)
    from glm53ctl.kernels.dense.kernel import DenseLaunch, SeparateLaunches, dense_kernel
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.tuning.knobs import defaults, resolve_grid

    spec = load_model("glm53_flash")
    k = resolve_grid({**defaults("dense"), **knobs}, DEV)
    launches = [DenseLaunch(spec, tp, rows, k, DEV)]
    if with_stages:
        launches += SeparateLaunches(spec, tp, rows, k, DEV).stages
    for la in launches:
        args = {n: (v.to(DEV) if isinstance(v, torch.Tensor) else v) for n, v in la.placeholder_args().items()}
        args |= la.runtime.args()
        dense_kernel.warmup(**args, **la.constexprs(), **la.options(), grid=(la.grid,))
        if traced:
            la.tracing = True
            dense_kernel.warmup(**args, **la.constexprs(), **la.options(), grid=(la.grid,))
    return job


def precompile(jobs):
    t = time.time()
    n = max(1, min(len(jobs), (os.cpu_count() or 2) - 2))
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_compile, jobs))
    print(f"compiled {len(jobs)} keys in {time.time() - t:.0f} s", flush=True)


def reference_rank0(spec, wl, H, conv, S, parts_a, parts_f, num):
    """Rank 0's share of the layer in stock PyTorch (the naive ops at `num`), the peers' partials given."""
    from glm53ctl.kernels.ffn.naive import swiglu_mlp
    from glm53ctl.kernels.kda.naive import kda_attention
    from glm53ctl.kernels.mhc.naive import gate, hc_post
    from glm53ctl.kernels.state import KdaState

    x, post, comb = gate(
        H, wl["hc_attn_fn"], wl["hc_attn_base"], wl["hc_attn_scale"], wl["input_layernorm.weight"], spec, num
    )
    a, _ = kda_attention(x, wl.sub("self_attn."), KdaState(conv, S), spec, num)
    for p in parts_a[1:]:
        a = a + p.to(num.dtype)
    H1 = hc_post(a, H, post, comb, num)
    x, post, comb = gate(
        H1, wl["hc_ffn_fn"], wl["hc_ffn_base"], wl["hc_ffn_scale"], wl["post_attention_layernorm.weight"], spec, num
    )
    m = swiglu_mlp(
        x, wl["mlp.gate_proj.weight"], wl["mlp.up_proj.weight"], wl["mlp.down_proj.weight"], spec.moe.swiglu_limit, num
    )
    for p in parts_f[1:]:
        m = m + p.to(num.dtype)
    return hc_post(m, H1, post, comb, num)


def launch_bytes(k, x) -> int:
    """What rank 0's launch must move: every weight it reads, the states read and written, H, the peers'
    partials, and its outputs."""
    la = k.launch
    n = sum(t.numel() * t.element_size() for t in k.w[0].values())
    conv, S = k.rank_state(x, 0)
    n += 2 * (conv.numel() * conv.element_size() + S.numel() * S.element_size())
    n += x.H.numel() * 2 + sum(t.numel() * t.element_size() for t in la.out.values())
    n += 2 * (k.tp - 1) * k.rows * k.spec.hidden * 4
    return n


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def main(out_dir: Path, tps=TPS, checks=True) -> None:
    from glm53ctl.kernels.checks import BOUNDS, fault_key, reference_outputs
    from glm53ctl.kernels.dense.kernel import SeparateLaunches
    from glm53ctl.kernels.gemv import folds
    from glm53ctl.kernels.launches import DenseKind
    from glm53ctl.kernels.numerics import Numerics, rel_rms
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env), flush=True)
    spec = load_model("glm53_flash")
    jobs = [(tp, rows, v, not v) for tp in tps for rows in ROWS for v in TIMED]
    jobs += [(tp, rows, v, False) for tp, rows in BITWISE_KEYS for v in VARIANTS if checks]
    precompile(jobs)
    w = Weights(spec, seed=0, device="cuda")
    res = {"env": env, "keys": [], "variants": [], "faults": []}
    warm_clocks()
    bw, _ = copy_bandwidth()
    res["copy_tb_s"] = bw
    print(f"copy bandwidth {bw:.3f} TB/s", flush=True)
    bf16 = Numerics(torch.bfloat16, torch.bfloat16)

    for tp in tps:
        for rows in ROWS:
            k = DenseKind(w, tp, rows, {}, DEV)
            x = k.inputs(seed=100 * tp + rows)[0].to(DEV)
            peers = k.peer_partials(x)
            out = k(x, peers, poison=True)
            ref = reference_outputs(w, k, x)
            row = {"tp": tp, "rows": rows, "knobs": k.knobs, "tasks": k.launch.table.n_tasks}
            row["rel_rms"] = {n: rel_rms(ref[n], out[n]) for n in BOUNDS["dense"]}
            row["accurate"] = all(row["rel_rms"][n] <= b for n, b in BOUNDS["dense"].items())
            row["grids_equal"] = all(
                same(out, DenseKind(w, tp, rows, {"grid": g}, DEV)(x, peers, poison=True)) for g in (132, 264)
            )
            row["repeats_equal"] = all(same(out, k(x, peers, poison=True)) for _ in range(3))
            conv0, S0 = k.rank_state(x, 0)
            la = k.launch
            if peers is not None:
                la.set_peers(peers.parts_a, peers.parts_f)
            ws = [k.w[0]] + [{n: t.clone() for n, t in k.w[0].items()} for _ in range(COPIES - 1)]
            it = iter(range(10**9))

            def persistent(la=la, ws=ws):
                la(x.H, ws[next(it) % COPIES], conv0, S0, check=False)

            sep = SeparateLaunches(spec, tp, rows, k.knobs, DEV)
            if peers is not None:
                sep.whole.set_peers(peers.parts_a, peers.parts_f)

            def separate(sep=sep, ws=ws):
                sep(x.H, ws[next(it) % COPIES], conv0, S0, check=False)

            sep_out = sep(x.H, k.w[0], conv0, S0)
            row["separate_equal"] = same({n: out[n] for n in sep_out}, sep_out)
            wl = w.layer(k.layer, 0, tp)
            Hb = x.H.clone()
            convb, Sb = conv0.to(torch.bfloat16), S0.to(torch.bfloat16)
            pa, pf = peers.parts_a if peers else [None], peers.parts_f if peers else [None]
            ref_fn = lambda: reference_rank0(spec, wl, Hb, convb, Sb, pa, pf, bf16)  # noqa: E731
            # timed: the persistent launch, separate launches, the bf16 reference; then knob variants
            us, rounds = graph_time(persistent)
            row["us"], row["rounds"] = us, rounds
            row["graph_replays_equal"] = all(torch.equal(out[n], t) for n, t in la.out.items())
            row["separate_us"] = graph_time(separate)[0]
            try:
                row["reference_bf16_us"] = graph_time(ref_fn, inner=3, rounds=7)[0]
            except Exception as e:  # recorded, not fatal: the launch's own figures still count
                row["reference_bf16_us"] = float("nan")
                row["reference_error"] = f"{type(e).__name__}: {e}"[:300]
            row["bytes"] = launch_bytes(k, x)
            row["floor_us"] = row["bytes"] / (bw * 1e12) * 1e6
            row["pct_copy"] = 100 * row["floor_us"] / us
            row["vs_separate"] = row["separate_us"] / us
            row["timed_variants"] = {}
            for v in TIMED[1:]:
                kv = DenseKind(w, tp, rows, v, DEV)
                if peers is not None:
                    kv.launch.set_peers(peers.parts_a, peers.parts_f)
                lv = kv.launch
                hc = spec.mhc.streams
                other_norm = folds(kv.knobs["norm"], rows, hc) != folds(k.knobs["norm"], rows, hc)
                # folded or not, a variant's weights differ in value, not in bytes: it times on its own copies
                wv = ws
                if other_norm:
                    wv = [kv.w[0]] + [{n: t.clone() for n, t in kv.w[0].items()} for _ in range(COPIES - 1)]
                row["timed_variants"][json.dumps(v)] = graph_time(
                    lambda lv=lv, wv=wv: lv(x.H, wv[next(it) % COPIES], conv0, S0, check=False)
                )[0]
                del wv
                if other_norm:  # numeric: its own accuracy and separate launches
                    o = kv(x, peers, poison=True)
                    row["norm_variant_rel_rms"] = {n: rel_rms(ref[n], o[n]) for n in BOUNDS["dense"]}
                    row["norm_variant_accurate"] = all(
                        row["norm_variant_rel_rms"][n] <= b for n, b in BOUNDS["dense"].items()
                    )
                    sepv = SeparateLaunches(spec, tp, rows, kv.knobs, DEV)
                    if peers is not None:
                        sepv.whole.set_peers(peers.parts_a, peers.parts_f)
                    sv = sepv(x.H, kv.w[0], conv0, S0)
                    row["norm_variant_separate_equal"] = same(sv, {n: o[n] for n in sv})
                    row["norm_variant_separate_us"] = graph_time(
                        lambda sepv=sepv, wv=kv.w[0]: sepv(x.H, wv, conv0, S0, check=False)
                    )[0]
                    del sepv
                del kv
            res["keys"].append(row)
            print(
                f"TP{tp} rows{rows}: {us:.1f} us (separate {row['separate_us']:.1f}, ref bf16 "
                f"{row['reference_bf16_us']:.0f}), floor {row['floor_us']:.1f} = {row['pct_copy']:.1f}% copy BW; "
                f"max rel {max(row['rel_rms'].values()):.2e} ok={row['accurate']} grids={row['grids_equal']} "
                f"repeats={row['repeats_equal']} separate_bits={row['separate_equal']} "
                f"variants {json.dumps({a: round(b, 1) for a, b in row['timed_variants'].items()})} "
                f"other norm: separate {row.get('norm_variant_separate_us', 0):.1f} "
                f"ok={row.get('norm_variant_accurate')} bits={row.get('norm_variant_separate_equal')} "
                f"max rel {max(row.get('norm_variant_rel_rms', {0: 0}).values()):.2e}",
                flush=True,
            )
            del k, sep, ws

    for tp, rows in BITWISE_KEYS if checks else ():
        k = DenseKind(w, tp, rows, {}, DEV)
        x = k.inputs(seed=7)[0].to(DEV)
        peers = k.peer_partials(x)
        out = k(x, peers, poison=True)
        for v in VARIANTS:
            eq = same(out, DenseKind(w, tp, rows, v, DEV)(x, peers, poison=True))
            res["variants"].append({"tp": tp, "rows": rows, "knobs": v, "bitwise_equal": eq})
            print(f"bitwise TP{tp} rows{rows} {v}: {eq}", flush=True)

    for tp, rows in BITWISE_KEYS if checks else ():
        t = time.time()
        f = fault_key(w, "dense", tp, rows, DEV, None, budget_ns=2_000_000, wall_s=30)
        row = {"tp": tp, "rows": rows, "sites": f.sites, "named": f.named, "hangs": f.hangs}
        row |= {"retries_equal": f.retries_equal, "worst_s": f.worst_s, "problems": f.problems[:5]}
        row["seconds"] = time.time() - t
        res["faults"].append(row)
        print(f"fault TP{tp} rows{rows}: {f.named}/{f.sites} named, {f.retries_equal} retries equal", flush=True)

    (out_dir / "results.json").write_text(json.dumps(res, indent=2))
    print(f"\ncopy {bw:.3f} TB/s")
    print("| TP | rows | µs | separate µs | ref bf16 µs | floor µs | % copy | vs separate | max rel RMS | bits |")
    for r in res["keys"]:
        bits = r["grids_equal"] and r["repeats_equal"] and r["separate_equal"]
        print(
            f"| {r['tp']} | {r['rows']} | {r['us']:.1f} | {r['separate_us']:.1f} | {r['reference_bf16_us']:.0f} | "
            f"{r['floor_us']:.1f} | {r['pct_copy']:.1f} | {r['vs_separate']:.2f} | "
            f"{max(r['rel_rms'].values()):.1e} | {bits} |"
        )
    print("variants bitwise:", all(v["bitwise_equal"] for v in res["variants"]))
    for f in res["faults"]:
        print(f"fault TP{f['tp']} rows{f['rows']}: {f['named']}/{f['sites']} named, retries {f['retries_equal']}")


def stage_breakdown(out_dir: Path, keys=((4, 1), (8, 1), (4, 8)), variants=({}, {"warps": 8})) -> None:
    """Where the time goes: each stage of the separate launches timed alone, and a plain GEMV of the
    in-projection's and gate/up's shapes (one ordinary launch, one tile per program) beside them."""
    from glm53ctl.kernels.dense.kernel import TYPE_NAMES, SeparateLaunches
    from glm53ctl.kernels.gemv import gemv
    from glm53ctl.kernels.launches import DenseKind
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_model("glm53_flash")
    precompile([(tp, rows, v, True) for tp, rows in keys for v in variants])
    w = Weights(spec, seed=0, device="cuda")
    warm_clocks()
    rows_out = []
    for tp, rows in keys:
        for v in variants:
            k = DenseKind(w, tp, rows, v, DEV)
            x = k.inputs(seed=1)[0].to(DEV)
            peers = k.peer_partials(x)
            conv0, S0 = k.rank_state(x, 0)
            sep = SeparateLaunches(spec, tp, rows, k.knobs, DEV)
            if peers is not None:
                sep.whole.set_peers(peers.parts_a, peers.parts_f)
            sep(x.H, k.w[0], conv0, S0)
            row = {"tp": tp, "rows": rows, "knobs": v, "stages": {}}
            for s, la in zip(sep.STAGES, sep.stages, strict=True):
                row["stages"][" + ".join(TYPE_NAMES[t] for t in s)] = graph_time(
                    lambda la=la: la(x.H, k.w[0], conv0, S0, check=False), inner=20, rounds=11
                )[0]
            xh = sep.whole.out["attn.x_hat"]
            for name, wt in (("plain in_proj", k.w[0]["w_in"]), ("plain gate", k.w[0]["w_gate"])):
                row["stages"][name] = graph_time(lambda wt=wt: gemv(xh, wt), inner=20, rounds=11)[0]
            rows_out.append(row)
            print(f"TP{tp} rows{rows} {v}: " + ", ".join(f"{a} {b:.1f}" for a, b in row["stages"].items()), flush=True)
    (out_dir / "stages.json").write_text(json.dumps(rows_out, indent=2))


SWEEP = (
    {},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 2},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 2, "poll": 2},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 2, "poll": 2, "oproj_first": 1},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 2, "poll": 2, "grid": 264},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 2, "poll": 2, "block_n_out": 16},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 2, "poll": 2, "block_n_out": 64},
    {"block_n_in": 32, "block_n_gu": 32, "ksplit": 2, "poll": 2},
    {"block_n_in": 32, "block_n_gu": 16, "ksplit": 4, "poll": 2},
    {"block_n_in": 16, "block_n_gu": 16, "ksplit": 2, "poll": 2},
)


def sweep(out_dir: Path, keys=((4, 1), (8, 1), (4, 8), (8, 8)), configs=SWEEP) -> None:
    """Knob configurations timed: the persistent launch and the separate launches with the same knobs."""
    from glm53ctl.kernels.dense.kernel import SeparateLaunches
    from glm53ctl.kernels.launches import DenseKind
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_model("glm53_flash")
    precompile([(tp, rows, v, False) for tp, rows in keys for v in configs])
    w = Weights(spec, seed=0, device="cuda")
    warm_clocks()
    bw, _ = copy_bandwidth()
    res = {"env": environment(), "copy_tb_s": bw, "rows": []}
    for tp, rows in keys:
        base = DenseKind(w, tp, rows, {}, DEV)
        x = base.inputs(seed=1)[0].to(DEV)
        peers = base.peer_partials(x)
        conv0, S0 = base.rank_state(x, 0)
        ws = [base.w[0]] + [{n: t.clone() for n, t in base.w[0].items()} for _ in range(COPIES - 1)]
        it = iter(range(10**9))
        floor = launch_bytes(base, x) / (bw * 1e12) * 1e6
        for v in configs:
            k = DenseKind(w, tp, rows, v, DEV)
            la = k.launch
            if peers is not None:
                la.set_peers(peers.parts_a, peers.parts_f)
            sep = SeparateLaunches(spec, tp, rows, k.knobs, DEV)
            if peers is not None:
                sep.whole.set_peers(peers.parts_a, peers.parts_f)
            us = graph_time(lambda la=la: la(x.H, ws[next(it) % COPIES], conv0, S0, check=False))[0]
            sep_us = graph_time(lambda sep=sep: sep(x.H, ws[next(it) % COPIES], conv0, S0, check=False))[0]
            la.runtime.check()
            row = {"tp": tp, "rows": rows, "knobs": v, "us": us, "separate_us": sep_us, "floor_us": floor}
            res["rows"].append(row)
            print(
                f"TP{tp} rows{rows} {json.dumps(v)}: {us:.1f} us ({100 * floor / us:.1f}% copy), separate {sep_us:.1f}",
                flush=True,
            )
            del k, sep
    (out_dir / "sweep.json").write_text(json.dumps(res, indent=2))


def recheck(out_dir: Path, repeats: int = 20) -> None:
    """oproj_first bitwise on the bitwise keys, every site stuck again, and site 8 at TP4 rows 1 (named -1
    once in the evidence run) stuck `repeats` times more."""
    from glm53ctl.kernels.checks import fault_key
    from glm53ctl.kernels.launches import DenseKind
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    out_dir.mkdir(parents=True, exist_ok=True)
    precompile([(tp, rows, v, False) for tp, rows in BITWISE_KEYS for v in ({}, {"oproj_first": 1})])
    w = Weights(load_model("glm53_flash"), seed=0, device="cuda")
    res = {"env": environment(), "bitwise": [], "faults": []}
    for tp, rows in BITWISE_KEYS:
        k = DenseKind(w, tp, rows, {}, DEV)
        x = k.inputs(seed=7)[0].to(DEV)
        peers = k.peer_partials(x)
        out = k(x, peers, poison=True)
        eq = same(out, DenseKind(w, tp, rows, {"oproj_first": 1}, DEV)(x, peers, poison=True))
        res["bitwise"].append({"tp": tp, "rows": rows, "knobs": {"oproj_first": 1}, "bitwise_equal": eq})
        print(f"bitwise TP{tp} rows{rows} oproj_first=1: {eq}", flush=True)
        f = fault_key(w, "dense", tp, rows, DEV, None, budget_ns=2_000_000, wall_s=30)
        res["faults"].append({"tp": tp, "rows": rows, "sites": f.sites, "named": f.named, "problems": f.problems})
        print(f"fault TP{tp} rows{rows}: {f.named}/{f.sites} named, {f.retries_equal} retries equal", flush=True)
    named = 0
    for _ in range(repeats):
        named += fault_key(w, "dense", 4, 1, DEV, 8, budget_ns=2_000_000, wall_s=30).named
    res["site8_named"] = f"{named}/{repeats}"
    print(f"site 8 at TP4 rows 1: named {named}/{repeats}", flush=True)
    (out_dir / "recheck.json").write_text(json.dumps(res, indent=2))


def tail_timing(out_dir: Path) -> None:
    """`tail` at TP4/TP8, rows 1/8 (issue 4's figure) at the current runtime, with its copy bandwidth."""
    from runtime_gpu import DeviceWeights, tail_bytes

    from glm53ctl.kernels.launches import KindLaunch
    from glm53ctl.kernels.spec import load_model

    out_dir.mkdir(parents=True, exist_ok=True)
    spec = load_model("glm53_flash")
    w = DeviceWeights(spec)
    warm_clocks()
    bw, _ = copy_bandwidth()
    res = {"env": environment(), "copy_tb_s": bw, "tail": []}
    for tp in (4, 8):
        for rows in (1, 8):
            k = KindLaunch(w, "tail", tp, rows, {}, DEV)
            x = k.inputs(seed=1)[0].to(DEV)
            peers = k.peer_partials(x)
            out = k.launch(x, k.norm, k.shards[0], peers)
            us = graph_time(
                lambda k=k, x=x, peers=peers, out=out: k.launch(x, k.norm, k.shards[0], peers, out=out, check=False)
            )[0]
            k.launch.runtime.check()
            floor = tail_bytes(spec, tp, rows) / (bw * 1e12) * 1e6
            # the bits across tile heights (sum_streams: the folded lm_head adds H's streams in stream order)
            ref = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
            bits = all(
                all(
                    torch.equal(ref[n], t)
                    for n, t in KindLaunch(w, "tail", tp, rows, {"block_n": b}, DEV)(x, peers, poison=True).items()
                )
                for b in (16, 32, 128)
            )
            res["tail"].append(
                {
                    "tp": tp,
                    "rows": rows,
                    "us": us,
                    "floor_us": floor,
                    "pct_copy": 100 * floor / us,
                    "block_n_bits": bits,
                }
            )
            print(
                f"tail TP{tp} rows{rows}: {us:.1f} us, floor {floor:.1f} = {100 * floor / us:.1f}% copy, "
                f"block_n 16/32/128 bitwise {bits}",
                flush=True,
            )
    (out_dir / "tail.json").write_text(json.dumps(res, indent=2))


TRACE_KEYS = ((1, 1), (4, 1), (8, 1), (8, 8))


def trace_keys(out_dir: Path, keys=TRACE_KEYS, configs=({},), verbose=True) -> None:
    """Where a launch's time goes: each task's claim, ready and publish (a traced build, runtime/trace.py), per
    task type and along the critical path; of 7 launches over rotated weights, the one with the median end."""
    from glm53ctl.kernels.launches import DenseKind
    from glm53ctl.kernels.runtime.trace import format_summary, summarize
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    out_dir.mkdir(parents=True, exist_ok=True)
    precompile([(tp, rows, v, False, True) for tp, rows in keys for v in configs])
    w = Weights(load_model("glm53_flash"), seed=0, device="cuda")
    warm_clocks()
    res = {"env": environment(), "keys": []}
    for tp, rows in keys:
        first = None
        for v in configs:
            k = DenseKind(w, tp, rows, v, DEV)
            x = k.inputs(seed=1)[0].to(DEV)
            peers = k.peer_partials(x)
            out = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
            first = first or out
            bits = same(first, out)  # the first configuration's bits (meaningful where only schedule knobs differ)
            la = k.launch
            if peers is not None:
                la.set_peers(peers.parts_a, peers.parts_f)
            conv0, S0 = k.rank_state(x, 0)
            ws = [k.w[0]] + [{n: t.clone() for n, t in k.w[0].items()} for _ in range(COPIES - 1)]
            it = iter(range(10**9))
            plain_us = graph_time(lambda la=la, ws=ws: la(x.H, ws[next(it) % COPIES], conv0, S0, check=False))[0]
            la.tracing = True
            traced_us = graph_time(lambda la=la, ws=ws: la(x.H, ws[next(it) % COPIES], conv0, S0, check=False))[0]
            runs = []
            for i in range(7):
                la(x.H, ws[i % COPIES], conv0, S0)
                torch.cuda.synchronize()
                runs.append(summarize(la.table, la.buf["trace"]))
            s = sorted(runs, key=lambda r: r["end_us"])[3]
            res["keys"].append(
                {"tp": tp, "rows": rows, "knobs": v, "us": plain_us, "traced_us": traced_us, "bits": bits, **s}
            )
            print(f"\n## TP{tp} rows{rows} {json.dumps(v)}: {plain_us:.1f} us ({traced_us:.1f} traced) bits {bits}")
            print(format_summary(s) if verbose else format_summary(s).split("critical path")[0], flush=True)
            del k, ws
    (out_dir / "trace.json").write_text(json.dumps(res, indent=2))


def ab_ratio(fa, fb, inner=20, rounds=25, seed=0) -> dict:
    """DESIGN.md §8's A against B: rounds of A B B A graph replays; per round the ratio of B's mean to A's
    (> 1: A is faster), its median, and a 95% bootstrap interval of the median (2000 resamples)."""
    import random
    import statistics

    ga, gb = capture_graph(fa, inner), capture_graph(fb, inner)

    def once(g):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) * 1000 / inner

    ratios, ta, tb = [], [], []
    for _ in range(rounds):
        a1, b1, b2, a2 = once(ga), once(gb), once(gb), once(ga)
        ta += [a1, a2]
        tb += [b1, b2]
        ratios.append((b1 + b2) / (a1 + a2))
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {
        "a_us": statistics.median(ta),
        "b_us": statistics.median(tb),
        "ratio": statistics.median(ratios),
        "ci95": (boot[50], boot[1949]),
        "rounds": rounds,
    }


def ab_keys(out_dir: Path, keys=((1, 8), (2, 8), (4, 8), (8, 8))) -> None:
    """The persistent launch (A) against its separate launches (B) in alternating rounds, after a same-against-
    same run of A (its interval sets δ = max(1%, 2 x its spread), DESIGN.md §8): the issue's "faster than the
    separate launches" by the keep rule's measure, at the keys where the margin is thinnest."""
    from glm53ctl.kernels.dense.kernel import SeparateLaunches
    from glm53ctl.kernels.launches import DenseKind
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    out_dir.mkdir(parents=True, exist_ok=True)
    precompile([(tp, rows, {}, True) for tp, rows in keys])
    spec = load_model("glm53_flash")
    w = Weights(spec, seed=0, device="cuda")
    warm_clocks()
    res = {"env": environment(), "keys": []}
    for tp, rows in keys:
        k = DenseKind(w, tp, rows, {}, DEV)
        x = k.inputs(seed=100 * tp + rows)[0].to(DEV)
        peers = k.peer_partials(x)
        conv0, S0 = k.rank_state(x, 0)
        la = k.launch
        sep = SeparateLaunches(spec, tp, rows, k.knobs, DEV)
        if peers is not None:
            la.set_peers(peers.parts_a, peers.parts_f)
            sep.whole.set_peers(peers.parts_a, peers.parts_f)
        ws = [k.w[0]] + [{n: t.clone() for n, t in k.w[0].items()} for _ in range(COPIES - 1)]
        it = iter(range(10**9))
        persistent = lambda la=la, ws=ws: la(x.H, ws[next(it) % COPIES], conv0, S0, check=False)  # noqa: E731
        separate = lambda sep=sep, ws=ws: sep(x.H, ws[next(it) % COPIES], conv0, S0, check=False)  # noqa: E731
        same_ab = ab_ratio(persistent, persistent)
        spread = max(abs(1 - same_ab["ci95"][0]), abs(same_ab["ci95"][1] - 1))
        delta = max(0.01, 2 * spread)
        ab = ab_ratio(persistent, separate)
        faster = ab["ci95"][0] > 1 + delta
        res["keys"].append(
            {"tp": tp, "rows": rows, "same": same_ab, "delta": delta, "vs_separate": ab, "faster": faster}
        )
        print(
            f"TP{tp} rows{rows}: persistent {ab['a_us']:.1f} us, separate {ab['b_us']:.1f} us, separate/persistent "
            f"{ab['ratio']:.3f} [{ab['ci95'][0]:.3f}, {ab['ci95'][1]:.3f}], delta {delta:.3f} (same against same "
            f"[{same_ab['ci95'][0]:.3f}, {same_ab['ci95'][1]:.3f}]): faster beyond delta {faster}",
            flush=True,
        )
        del k, sep, ws
    (out_dir / "ab.json").write_text(json.dumps(res, indent=2))


def stream_probe(out_dir: Path) -> None:
    """How fast one program streams a GEMV tile's weights, as plain launches of the GEMV body over a gate-sized
    matrix [1536, 4096] bf16 (TP8's w_gate; 8 copies rotated past the L2), one tile per program: µs, total
    TB/s and GB/s per program, by tile height, K tile, warps and pipelining depth; beside a load-and-sum
    kernel with no tl.dot. The layer launch streams its GEMV stages at 13-15 GB/s per program."""
    import triton
    import triton.language as tl

    from glm53ctl.kernels.gemv import gemv_kernel

    @triton.jit
    def stream_kernel(w, y, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        n0 = tl.program_id(0) * BLOCK_N
        o_n = n0 + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            o_k = k0 + tl.arange(0, BLOCK_K)
            acc += tl.sum(tl.load(w + o_n[:, None] * K + o_k[None, :]).to(tl.float32), axis=1)
        tl.store(y + o_n, acc)

    out_dir.mkdir(parents=True, exist_ok=True)
    warm_clocks()
    N, K, copies = 1536, 4096, 8
    ws = [torch.randn(N, K, device=DEV).to(torch.bfloat16) for _ in range(copies)]
    x = torch.randn(1, K, device=DEV).to(torch.bfloat16)
    y = torch.empty(16, 4 * N, device=DEV)
    it = iter(range(10**9))
    rows = []
    configs = [
        ("gemv", bn, bk, nw, ns)
        for bn, bk, nw, ns in (
            (16, 128, 4, 4),
            (16, 128, 4, 2),
            (16, 128, 4, 8),
            (16, 256, 4, 4),
            (16, 512, 4, 3),
            (32, 128, 4, 4),
            (64, 128, 4, 4),
            (16, 128, 8, 4),
            (16, 128, 2, 4),
            (16, 128, 1, 4),
        )
    ]
    configs += [("stream", bn, bk, nw, ns) for bn, bk, nw, ns in ((16, 128, 4, 4), (16, 512, 4, 4), (16, 1024, 4, 3))]
    # the same bytes as more, shorter rows: a split K's programs (2 or 4 slices); and a copy of them
    configs += [("gemv", 16, 128, 4, 4, 2), ("gemv", 16, 128, 4, 4, 4), ("gemv", 32, 128, 4, 4, 2)]
    configs += [("copy", 0, 0, 8, 1)]
    for kind, bn, bk, nw, ns, *split in configs:
        ks = split[0] if split else 1
        wk = [w.view(N * ks, K // ks) for w in ws]
        grid = (N * ks // bn,) if bn else (triton.cdiv(N * K, 8192),)
        if kind == "copy":  # bytes read + written: twice the GEMV's
            dst = torch.empty_like(ws[0])

            def fn(dst=dst, grid=grid):
                _copy_kernel[grid](ws[next(it) % copies], dst, N * K, BLOCK=8192, num_warps=8)

        elif kind == "gemv":

            def fn(grid=grid, wk=wk, ks=ks, bn=bn, bk=bk, nw=nw, ns=ns):
                w = wk[next(it) % copies]
                gemv_kernel[grid](x, w, y, 1, N * ks, K // ks, bn, bk, False, num_warps=nw, num_stages=ns)

        else:

            def fn(grid=grid, bn=bn, bk=bk, nw=nw, ns=ns):
                stream_kernel[grid](ws[next(it) % copies], y, K, bn, bk, num_warps=nw, num_stages=ns)

        us = graph_time(fn)[0]
        tb = N * K * 2 / us / 1e6
        row = {"kind": kind, "block_n": bn, "block_k": bk, "warps": nw, "stages": ns, "programs": grid[0], "us": us}
        row |= {"k_slices": ks, "tb_s": tb, "gb_s_per_program": 1000 * tb / grid[0]}
        rows.append(row)
        print(
            f"{kind} BN{bn} BK{bk} w{nw} st{ns} ks{ks} x{grid[0]}: {us:.1f} us, {tb:.2f} TB/s, "
            f"{row['gb_s_per_program']:.1f} GB/s per program",
            flush=True,
        )
    (out_dir / "stream.json").write_text(json.dumps({"env": environment(), "rows": rows}, indent=2))


if __name__ == "__main__":
    if "--tail" in sys.argv:
        tail_timing(Path(sys.argv[1]))
        sys.exit(0)
    if "--ab" in sys.argv:  # [--keys 1x8,...]: the persistent launch against its separate launches, A B B A
        j = sys.argv.index("--keys") + 1 if "--keys" in sys.argv else 0
        keys = tuple(tuple(int(v) for v in k.split("x")) for k in sys.argv[j].split(",")) if j else None
        ab_keys(Path(sys.argv[1]), keys or ((1, 8), (2, 8), (4, 8), (8, 8)))
        sys.exit(0)
    if "--stream" in sys.argv:
        stream_probe(Path(sys.argv[1]))
        sys.exit(0)
    if "--trace" in sys.argv:  # [--configs JSON-LIST]: knob sets traced one after another per key
        i = sys.argv.index("--configs") + 1 if "--configs" in sys.argv else 0
        configs = tuple(json.loads(sys.argv[i])) if i else ({},)
        j = sys.argv.index("--keys") + 1 if "--keys" in sys.argv else 0  # [--keys 1x8,4x1]: TP x rows
        keys = tuple(tuple(int(v) for v in k.split("x")) for k in sys.argv[j].split(",")) if j else None
        trace_keys(Path(sys.argv[1]), keys or TRACE_KEYS, configs=configs, verbose=len(configs) == 1)
        sys.exit(0)
    # OUT_DIR [TPS, e.g. 4,8] [--no-checks]: one device call stays under its time limit
    if "--sweep" in sys.argv:
        sweep(Path(sys.argv[1]))
        sys.exit(0)
    if "--publish" in sys.argv:  # box words by relaxed stores after one fence: dense's knobs, then tail
        sweep(Path(sys.argv[1]), ((1, 1), (2, 1), (4, 1), (8, 1), (4, 8), (8, 8)), ({}, {"handoff": "flag"}))
        tail_timing(Path(sys.argv[1]))
        sys.exit(0)
    if "--sweep-prefetch" in sys.argv:  # prefetch 2: the latency-bound tasks' operands to L2 before their waits
        sweep(
            Path(sys.argv[1]),
            ((1, 1), (2, 1), (4, 1), (8, 1), (4, 8), (8, 8)),
            ({}, {"prefetch": 2}, {"chunk_cols": 128}, {"chunk_cols": 64}, {"prefetch": 2, "chunk_cols": 128}),
        )
        sys.exit(0)
    if "--recheck" in sys.argv:
        recheck(Path(sys.argv[1]))
        sys.exit(0)
    if "--stages" in sys.argv:
        stage_breakdown(Path(sys.argv[1]))
        sys.exit(0)
    tps = tuple(int(t) for t in sys.argv[2].split(",")) if len(sys.argv) > 2 else TPS
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "out"), tps, "--no-checks" not in sys.argv)
