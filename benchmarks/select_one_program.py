"""Experiment (issue 47): a row's exact top-k of its pools in one program, alone, by four bodies, beside the
5-step selection over parts that the layer runs today. Which body is short enough for the layer's selection to be
one task a row again (knob select=row, dropped on 2026-12-07 with the 256-bin histogram body)?

- hist8: four 8-bit radix passes, each a 256-bin `tl.histogram` (knob select=row);
- cmpN: radix passes of N bits whose digit counts are comparisons summed over the keys (no histogram), 32/N
  passes (N = 4: knob select=row4);
- sort: the keys packed with their pool index (ties by index ascending) and sorted in the program (`tl.sort`);
  the threshold is the TOPP-th packed key, exact with the ties (knob select=rowsort);
- parts: today's 5 launches over parts (`select_runner`).

Each is `select_row` (kernels/ops/dsa/select.py) with its `BITS`, at 4 and 8 warps.

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

from glm53ctl.kernels.ops.dsa.select import _row_kernel, select_runner
from glm53ctl.kernels.spec import load_model

BODIES = {"hist8": 8, "cmp4": 4, "cmp2": 2, "sort": 0}  # select_row's BITS


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
        bodies = {f"{name} w{warps}": (bits, warps) for warps in (4, 8) for name, bits in BODIES.items()}
        for kind in ("randn", "ties"):
            s = _scores(pools, kind, device)
            n = torch.tensor([pools * KP], dtype=torch.int32, device=device)
            want = select_token_rows(s.double().cpu(), n.cpu(), spec)
            runs = {"parts": select_runner(s, n, spec)}
            for name, (bits, warps) in bodies.items():
                out = torch.full((1, WIDTH), -7, dtype=torch.int32, device=device)

                def run(bits=bits, warps=warps, out=out):
                    _row_kernel[(1,)](s, out, n, 0, KP=KP, TOPP=TOPP, WIDTH=WIDTH, ROW=ROW, BITS=bits, num_warps=warps)
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
