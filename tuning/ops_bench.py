"""An op's body alone (`glm53ctl bench --op NAME`): the latency-bound steps of a layer's critical path, each as its
op's plain launch over the op's sizes, timed as bench times a launch (a CUDA graph of launches, the median over
replays). Beside a step's time in the launch (`bench --trace`), it says how much of that time is the body itself
and how much the launch around it adds (docs/perf/path.md).

Each op names its sizes (the selection: the pools a row's caches hold; the routing: the rows) and makes, for one
size of a model, its inputs and the launch to time (`make(spec, size, device)` -> a callable that launches into
buffers made once).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glm53ctl.kernels.ops.dsa.select import select_runner
from glm53ctl.kernels.ops.ffn.moe import ROUTER_SLICES, route_runner
from glm53ctl.tuning import measure


@dataclass(frozen=True)
class OpBench:
    summary: str
    unit: str  # what a size counts
    sizes: tuple[int, ...]  # the default sizes
    make: Callable  # (spec, size, device) -> the launch to time
    launches: int  # plain launches a call makes


def _select(spec, pools: int, device, row: bool = False) -> Callable:
    """One row's selection over `pools` pools of random scores, its caches full (pools x kpool tokens); `row`: in
    one program (knob select=row)."""
    g = torch.Generator(device="cpu").manual_seed(pools)
    scores = torch.randn(1, pools, generator=g).to(device)
    n = torch.tensor([pools * spec.indexer.kpool])
    return select_runner(scores, n, spec, row=row)


def _route(spec, rows: int, device) -> Callable:
    """`rows` rows' routing from random router logits in its four K slices, and the correction bias."""
    g = torch.Generator(device="cpu").manual_seed(rows)
    logits = torch.randn(ROUTER_SLICES, 16, spec.moe.experts, generator=g).to(device)
    bias = (0.1 * torch.randn(spec.moe.experts, generator=g)).to(device)
    return route_runner(logits, bias, spec, rows)


OPS = {
    "select": OpBench(
        "the exact top-k of a row's pools and their tokens (ops/dsa/select.py: four radix passes and the take)",
        "pools",
        (256, 1024, 4096, 16384, 32768),
        _select,
        5,
    ),
    "select_row": OpBench(
        "the same top-k in one program a row (knob select=row: every key in registers, the passes and the take)",
        "pools",
        (256, 1024, 4096),
        lambda spec, pools, device: _select(spec, pools, device, row=True),
        1,
    ),
    "route": OpBench(
        "the routing: each row's top-k experts from its router logits (ops/ffn/moe.py, a program a row)",
        "rows",
        (1, 2, 4, 8),
        _route,
        1,
    ),
}


def time_op(name: str, spec, size: int, rounds: int, device: str = "cuda") -> dict:
    """One op at one size: µs per call (its plain launches in a CUDA graph; the median over replays)."""
    run = OPS[name].make(spec, size, device)
    t = measure.graph_time(run, inner=20, rounds=rounds)
    return {"op": name, OPS[name].unit: size, "size": size, "us": t.median_us, "rounds_us": t.rounds_us}
