"""Is the routing's top-8 shorter as a bitonic top-k than as eight packed-max reductions? (issue 47)

The MoE's routing (kernels/ops/ffn/moe.py `topk_row`) picks a row's 8 experts of 288 with eight dependent
`tl.max` reductions over the packed keys (the key's order in the high word, the index reversed in the low one):
23 barriers in the SASS of one pick. `tl.topk` (a bitonic top-k) finds the same 8 packed values with 5. Both are
timed here alone, 64 dependent rounds in one program a SM, minus one round: the pick's own latency, which every
routed gate/up task pays before it can ask for its expert's weights (knob route=each).

    python benchmarks/route_pick.py          # on a GPU: µs a round of each
    TRITON_INTERPRET=1 python benchmarks/route_pick.py --check   # on a CPU: the same picks, ties included

H100, 2026-12-07: 1.83 µs a round (eight reductions) against 1.59 (bitonic), 0.24 µs off a decision; not built
(docs/perf/path.md). Those figures came from the same two picks timed by plain launches (their Python launch
overhead in both counts, so it cancels in the difference); this script times CUDA graphs and was not rerun.
"""

import sys

import torch
import triton
import triton.language as tl

from glm53ctl.kernels.ops.ffn.moe import topk_row

E, BLOCK_E, TOPK = 288, 512, 8


@triton.jit
def _pick(key, o_e, E: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr, BITONIC: tl.constexpr):
    """Which of the experts the top-k chooses (1/0): the kernels' own `topk_row`, or the k-th largest of the same
    packed values by `tl.topk` (they are distinct, so every one at or above it is chosen)."""
    if BITONIC:
        bits = key.to(tl.int32, bitcast=True)
        order = tl.where(o_e < E, bits ^ ((bits >> 31) & 0x7FFFFFFF), -(2**31))
        packed = (order.to(tl.int64) << 32) | (BLOCK_E - 1 - o_e).to(tl.int64)
        chosen = (packed >= tl.min(tl.topk(packed, TOPK), axis=0)).to(tl.int32)
    else:
        chosen, _ = topk_row(key, key, E, BLOCK_E, TOPK, 1.0)
    return chosen


@triton.jit
def _rounds(keys, out, N, E: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr, BITONIC: tl.constexpr):
    o_e = tl.arange(0, BLOCK_E)
    key = tl.load(keys + tl.program_id(0) * E + o_e, mask=o_e < E, other=float("-inf"))
    total = tl.zeros((BLOCK_E,), tl.int32)
    for _ in range(N):  # dependent: each round's keys move by the last round's picks
        c = _pick(key, o_e, E, BLOCK_E, TOPK, BITONIC)
        total += c
        key = key - c.to(tl.float32) * 0.5
    tl.store(out + tl.program_id(0) * BLOCK_E + o_e, total)


def check() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(4):
        keys = (torch.rand(8, E, generator=g) * (4 if trial % 2 else 1000)).round() / 1000  # exact ties
        a, b = (torch.empty(8, BLOCK_E, dtype=torch.int32) for _ in range(2))
        _rounds[(8,)](keys, a, 1, E, BLOCK_E, TOPK, False)
        _rounds[(8,)](keys, b, 1, E, BLOCK_E, TOPK, True)
        assert torch.equal(a, b) and (a.sum(1) == TOPK).all(), trial
    print("the same picks")


def time_rounds() -> None:
    keys = torch.rand(132, E, device="cuda")
    out = torch.empty(132, BLOCK_E, dtype=torch.int32, device="cuda")
    for bitonic in (False, True):
        us = {}
        for n in (1, 65):
            graph = torch.cuda.CUDAGraph()
            _rounds[(132,)](keys, out, n, E, BLOCK_E, TOPK, bitonic)
            with torch.cuda.graph(graph):
                _rounds[(132,)](keys, out, n, E, BLOCK_E, TOPK, bitonic)
            times = []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b) * 1000)
            us[n] = sorted(times)[len(times) // 2]
        print(f"{'bitonic' if bitonic else 'eight reductions'}: {(us[65] - us[1]) / 64:.2f} us a round")


if __name__ == "__main__":
    check() if "--check" in sys.argv else time_rounds()
