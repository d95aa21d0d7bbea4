"""Does a GEMV stage stream faster from L2 than from HBM? (issue 7: whether staging the next stage's weights in
L2 during a latency-bound step could shorten the stage after it.)

Run on the GPU machine from the repository root:  PYTHONUNBUFFERED=1 python3 benchmarks/l2_stream.py OUT_DIR
One plain launch per GEMV stage of glm53_flash's dense layer at TP8 and TP4 rows 1 (`gemv_tile`, the layer's
task body, one tile and K slice a program), timed two ways in the same run: "cold", each launch on another of
enough weight copies that none is in L2; "warm", every launch on one copy, which then stays in L2 (the stage's
bytes are below the L2's size). Beside them a copy kernel reading the same bytes cold and warm. Writes
results.json; prints a table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.gemv.kernel import gemv_tile
from glm53ctl.tuning.measure import environment, graph_time, warm_clocks

DEV = "cuda"


@triton.jit
def _sliced_gemv(x, w, y, R, N: tl.constexpr, K: tl.constexpr, KS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program (tile, K slice): rows BN of y[slice] = x[:, slice] @ w[tile, slice]^T (the layer's GEMV task)."""
    n0 = tl.program_id(0) * BN
    ks = tl.program_id(1)
    KK: tl.constexpr = K // KS
    acc = gemv_tile(x + ks * KK, K, w + ks * KK, n0, R, N, KK, K, BN, BK, False)
    o_m = tl.arange(0, 16)
    o_n = n0 + tl.arange(0, BN)
    tl.store(y + ks * 16 * N + o_m[:, None] * N + o_n[None, :], acc, mask=(o_m[:, None] < R) & (o_n[None, :] < N))


@triton.jit
def _read_kernel(src, out, n, BLOCK: tl.constexpr):
    """Reads BLOCK bf16 a program and writes one float: the read side of a copy."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    s = tl.sum(tl.load(src + o, mask=o < n, other=0.0).to(tl.float32), axis=0)
    tl.store(out + tl.program_id(0), s)


# (stage, N, K) per rank, rows 1 (docs/model.md §9; gate and up as one matrix of both)
STAGES = {
    8: (("o_proj", 4096, 1024), ("gate_up", 3072, 4096), ("down", 4096, 1536), ("in_proj", 3336, 4096)),
    4: (("o_proj", 4096, 2048), ("gate_up", 6144, 4096), ("down", 4096, 3072)),
}
TILES = ((32, 1), (32, 2), (32, 4), (16, 2), (64, 1))


def timed(fn_for_copy, copies: int):
    """µs per launch over `copies` rotated weight copies (1: always the same, so warm in L2)."""
    state = {"i": 0}

    def step():
        fn_for_copy(state["i"] % copies)
        state["i"] += 1

    us, _ = graph_time(step, inner=copies * max(1, 24 // copies))
    return us


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(DEV)
    l2 = props.L2_cache_size
    warm_clocks()
    rows = []
    for tp, stages in STAGES.items():
        for name, N, K in stages:
            nbytes = N * K * 2
            copies = max(2, -(-3 * l2 // nbytes))  # at least 3 L2s of weights in rotation
            ws = [torch.randn(N, K, device=DEV).to(torch.bfloat16) for _ in range(copies)]
            x = torch.randn(1, K, device=DEV).to(torch.bfloat16)

            def measure(launch, block_n, k_slices, programs):
                """Times one launch cold and warm; a row of the results (block_n 0: the read kernel)."""
                cold, warm = timed(launch, copies), timed(launch, 1)
                row = dict(tp=tp, stage=name, N=N, K=K, mb=nbytes / 1e6, block_n=block_n, k_slices=k_slices)
                rows.append(row | dict(programs=programs, cold_us=cold, warm_us=warm))
                print(json.dumps(rows[-1]))

            for bn, ks in TILES:
                y = torch.empty(ks, 16, N, device=DEV)
                grid = (triton.cdiv(N, bn), ks)

                def run(i, bn=bn, ks=ks, y=y, grid=grid):
                    _sliced_gemv[grid](x, ws[i], y, 1, N, K, ks, bn, 128, num_warps=4, num_stages=4)

                measure(run, bn, ks, grid[0] * ks)
            out = torch.empty(triton.cdiv(N * K, 8192), device=DEV)

            def read(i):
                _read_kernel[(triton.cdiv(N * K, 8192),)](ws[i], out, N * K, 8192)

            measure(read, 0, 0, out.numel())
    res = {"env": environment(" ".join(["python3", *sys.argv])) | {"l2_bytes": l2}, "rows": rows}
    (out_dir / "results.json").write_text(json.dumps(res, indent=1))
    print(f"\nL2 {l2 / 2**20:.0f} MiB")
    print(
        "| TP | stage | MB | tile (rows x K slices) | programs | cold µs | warm µs | cold / warm | cold TB/s | warm TB/s |"
    )
    for r in rows:
        tile = f"{r['block_n']} x {r['k_slices']}" if r["block_n"] else "read kernel"
        print(
            f"| {r['tp']} | {r['stage']} | {r['mb']:.1f} | {tile} | {r['programs']} | {r['cold_us']:.1f} | "
            f"{r['warm_us']:.1f} | {r['cold_us'] / r['warm_us']:.2f} | {r['mb'] / r['cold_us']:.2f} | "
            f"{r['mb'] / r['warm_us']:.2f} |"
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
