"""Experiment (issue 47): a row's exact top-k of its pools in one program, alone, by four bodies, beside the
5-step selection over parts that the layer runs today. Which body is short enough for the layer's selection to be
one task a row again (knob select=row, dropped on 2026-12-07 with the 256-bin histogram body)?

- hist8: `select_row` as it is: four 8-bit radix passes, each a 256-bin `tl.histogram`;
- cmpN: radix passes of N bits whose digit counts are comparisons summed over the keys (no histogram), 32/N passes;
- sort: the keys packed with their pool index (ties by index ascending) and sorted in the program (`tl.sort`);
  the threshold is the TOPP-th packed key, exact with the ties;
- parts: today's 5 launches over parts (`select_runner`).

Each body's tokens are checked equal to the reference's (`select_token_rows`) on scores with ties (exact zeros, as
ReLU gives, and repeated values), then timed in a CUDA graph (triton.testing.do_bench_cudagraph, median). Run on a
GPU: python benchmarks/select_one_program.py [--pools 1024,2048,4096] [--json FILE]. Under TRITON_INTERPRET=1 on
the CPU it checks the bodies only (no timing).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.dsa.select import _row_kernel, score_key, select_runner, write_tail
from glm53ctl.kernels.spec import load_model


@triton.jit
def _take(idx, n, P, key, thr_take, m, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr,
          ROW: tl.constexpr):  # fmt: skip
    """The taken pools' tokens in pool order, then the tail and the -1s (as `select_row`)."""
    o_p = tl.arange(0, ROW)
    take = m & (thr_take | (P <= TOPP))
    slot = tl.cumsum(take.to(tl.int32), axis=0) - 1
    for j in tl.static_range(KP):
        tl.store(idx + slot * KP + j, o_p * KP + j, mask=take)
    write_tail(idx, n, P, KP, TOPP, WIDTH, ROW)


@triton.jit
def _cmp_kernel(scores, idx, n_ptr, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr, ROW: tl.constexpr,
                BITS: tl.constexpr):  # fmt: skip
    n = tl.load(n_ptr)
    P = n // KP
    o_p = tl.arange(0, ROW)
    m = o_p < P
    key = score_key(tl.load(scores + o_p, mask=m, other=0.0))
    prefix = tl.zeros((), dtype=tl.uint32)
    left = TOPP + 0 * P
    if P > TOPP:
        NB: tl.constexpr = 1 << BITS
        o_d = tl.arange(0, NB)
        for i in tl.static_range(32 // BITS):
            match = m
            if i > 0:
                match = match & ((key >> (32 - BITS * i)) == (prefix >> (32 - BITS * i)))
            dig = ((key >> (32 - BITS * (i + 1))) & (NB - 1)).to(tl.int32)
            counts = tl.sum(((dig[None, :] == o_d[:, None]) & match[None, :]).to(tl.int32), axis=1)
            above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0)
            d = tl.max(tl.where(above + counts >= left, o_d, -1), axis=0)
            left -= tl.sum(tl.where(o_d > d, counts, 0), axis=0)
            prefix = prefix | (d.to(tl.uint32) << (32 - BITS * (i + 1)))
    eq_p = m & (key == prefix)
    above_thr = (key > prefix) | (eq_p & (tl.cumsum(eq_p.to(tl.int32), axis=0) <= left))
    _take(idx, n, P, key, above_thr, m, KP, TOPP, WIDTH, ROW)


@triton.jit
def _sort_kernel(scores, idx, n_ptr, KP: tl.constexpr, TOPP: tl.constexpr, WIDTH: tl.constexpr, ROW: tl.constexpr):
    n = tl.load(n_ptr)
    P = n // KP
    o_p = tl.arange(0, ROW)
    m = o_p < P
    key = score_key(tl.load(scores + o_p, mask=m, other=0.0))
    # score descending, then pool index ascending: the low word is the index's complement; 0 for no pool
    packed = (key.to(tl.uint64) << 32) | (o_p ^ -1).to(tl.uint32, bitcast=True).to(tl.uint64)
    packed = tl.where(m, packed, 0)
    ranked = tl.sort(packed, descending=True)
    thr = tl.max(tl.where(o_p == TOPP - 1, ranked, 0), axis=0)
    _take(idx, n, P, key, packed >= thr, m, KP, TOPP, WIDTH, ROW)


def _scores(pools: int, kind: str, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(pools)
    s = torch.randn(1, pools, generator=g)
    if kind == "ties":  # ReLU's exact zeros and repeated values across the threshold
        s = torch.relu(s).mul(8).round().div(8)
    return s.to(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pools", default="1024,2048,4096")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    device = "cpu" if interp else "cuda"
    spec = load_model("glm53_flash")
    KP, TOPP, WIDTH = spec.indexer.kpool, spec.index_pools, spec.index_width
    from glm53ctl.kernels.ops.dsa.naive import select_token_rows

    rows = []
    for pools in [int(p) for p in args.pools.split(",")]:
        ROW = triton.next_power_of_2(pools)
        bodies = {}
        for warps in (4, 8):
            for bits in (4, 2):
                bodies[f"cmp{bits} w{warps}"] = (_cmp_kernel, dict(BITS=bits), warps)
            bodies[f"sort w{warps}"] = (_sort_kernel, {}, warps)
        for kind in ("randn", "ties"):
            s = _scores(pools, kind, device)
            n = torch.tensor([pools * KP], dtype=torch.int32, device=device)
            want = select_token_rows(s.double().cpu(), n.cpu(), spec)
            runs = {"parts": select_runner(s, n, spec), "hist8 w4": select_runner(s, n, spec, row=True)}
            out8 = torch.full((1, WIDTH), -7, dtype=torch.int32, device=device)

            def hist8_w8(out=out8):
                _row_kernel[(1,)](s, out, n, 0, KP=KP, TOPP=TOPP, WIDTH=WIDTH, ROW=ROW, num_warps=8)
                return out

            runs["hist8 w8"] = hist8_w8
            for name, (kern, extra, warps) in bodies.items():
                out = torch.full((1, WIDTH), -7, dtype=torch.int32, device=device)

                def run(kern=kern, extra=extra, warps=warps, out=out):
                    kern[(1,)](s, out, n, KP=KP, TOPP=TOPP, WIDTH=WIDTH, ROW=ROW, num_warps=warps, **extra)
                    return out

                runs[name] = run
            for name, run in runs.items():
                got = run()
                ok = torch.equal(got.cpu().long(), torch.as_tensor(want).long().view_as(got.cpu()))
                us = None
                if not interp and kind == "randn":
                    us = 1e3 * triton.testing.do_bench_cudagraph(run, rep=200)
                rows.append(dict(pools=pools, scores=kind, body=name, equal=bool(ok), us=us))
                print(f"{pools:6d} {kind:6s} {name:10s} equal={ok} {'' if us is None else f'{us:7.2f} us'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print("\npools  body        µs (randn)   equal (randn, ties)")
    for pools in sorted({r["pools"] for r in rows}):
        for body in dict.fromkeys(r["body"] for r in rows if r["pools"] == pools):
            rr = [r for r in rows if r["pools"] == pools and r["body"] == body]
            us = next((r["us"] for r in rr if r["us"] is not None), None)
            print(f"{pools:6d} {body:10s} {'-' if us is None else f'{us:8.2f}'}   {[r['equal'] for r in rr]}")


if __name__ == "__main__":
    main()
