"""An op's body alone (`glm53ctl bench --op NAME`): the latency-bound steps of a layer's critical path, each as its
op's plain launch over the op's sizes, timed as bench times a launch (a CUDA graph of launches, the median over
replays). Beside a step's time in the launch (`bench --trace`), it says how much of that time is the body itself
and how much the launch around it adds (docs/perf/path.md).

Each op names its sizes (the selection: the pools a row's caches hold; the routing: the rows; the KDA heads and the
MLA attention: a rank's heads) and makes, for one size of a model, its inputs and the launch to time (`make(spec,
size, device)` -> a callable that launches into buffers made once, or allocates only; its inputs in `run.inputs`,
which the tests hold against the reference).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glm53ctl.kernels.kinds.layer.shared import gate_runner
from glm53ctl.kernels.ops.dsa.attend import sparse_mla_launch
from glm53ctl.kernels.ops.dsa.indexer import scores_runner
from glm53ctl.kernels.ops.dsa.naive import mla_scale
from glm53ctl.kernels.ops.dsa.select import LOCAL_POOLS, select_runner
from glm53ctl.kernels.ops.ffn.moe import ROUTER_SLICES, route_runner
from glm53ctl.kernels.ops.kda.kernel import kda_core
from glm53ctl.tuning import measure


@dataclass(frozen=True)
class OpBench:
    summary: str
    unit: str  # what a size counts
    sizes: tuple[int, ...]  # the default sizes
    make: Callable  # (spec, size, device) -> the launch to time
    launches: int  # plain launches a call makes
    most: int | None = None  # the largest size it takes (None: any)


def _select(spec, pools: int, device, passes: int = 4) -> Callable:
    """One row's selection over `pools` pools of random scores, its caches full (pools x kpool tokens); `passes`:
    the radix passes that are launches of their own (knob select_passes)."""
    g = torch.Generator(device="cpu").manual_seed(pools)
    scores = torch.randn(1, pools, generator=g).to(device)
    n = torch.tensor([pools * spec.indexer.kpool])
    return select_runner(scores, n, spec, passes=passes)


def _route(spec, rows: int, device) -> Callable:
    """`rows` rows' routing from random router logits in its four K slices, and the correction bias."""
    g = torch.Generator(device="cpu").manual_seed(rows)
    logits = torch.randn(ROUTER_SLICES, 16, spec.moe.experts, generator=g).to(device)
    bias = (0.1 * torch.randn(spec.moe.experts, generator=g)).to(device)
    return route_runner(logits, bias, spec, rows)


def _random(seed: int, device):
    """A draw of random tensors: (shape, scale, dtype) -> a tensor on `device`, from one CPU generator."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return lambda *shape, scale=1.0, dtype=torch.float32: (scale * torch.randn(*shape, generator=g)).to(device, dtype)


def _with_inputs(run: Callable, *inputs) -> Callable:
    run.inputs = inputs
    return run


def _kda_head(spec, heads: int, device) -> Callable:
    """One row's KDA core over `heads` heads (a rank's: 64 / TP), a program a head: the short conv, the safe gate,
    the delta rule on each [K, K] state and the gated RMSNorm (`kda_core`, the body of the layer's KDA head task
    without its two low-rank GEMVs, whose outputs f and og are inputs here)."""
    K, W = spec.kda.head_dim, spec.kda.conv_kernel
    P, rnd = heads * K, _random(heads, device)
    u, b, f, og = rnd(1, 3 * P), rnd(1, heads), rnd(1, P), rnd(1, P)
    conv, S = rnd(1, W - 1, 3 * P, dtype=torch.bfloat16), rnd(1, heads, K, K, scale=0.1)
    conv_w, A_log, dt_bias = rnd(3 * P, W, scale=0.5), rnd(heads, scale=0.5), rnd(P, scale=0.5)
    o_norm_w = (1 + rnd(K, scale=0.1)).to(torch.bfloat16)
    inputs = (u, b, f, og, conv, S, conv_w, A_log, dt_bias, o_norm_w)
    return _with_inputs(lambda: kda_core(*inputs, spec), *inputs)


def _gate(spec, rows: int, device) -> Callable:
    """The mHC gate of `rows` rows as the layer lays it out: a MIX task a row and column chunk (128 columns), then
    a GATE task a chunk and the COMB task (kinds/layer/shared.py `gate_runner`: two launches)."""
    hc, D, rnd = spec.mhc.streams, spec.hidden, _random(rows, device)
    H = rnd(rows, hc, D, dtype=torch.bfloat16)
    fn, base = rnd((2 + hc) * hc, hc * D, scale=(hc * D) ** -0.5), rnd((2 + hc) * hc, scale=0.1)
    scale, norm_w = 1 + rnd(3, scale=0.1), (1 + rnd(D, scale=0.1)).to(torch.bfloat16)
    return _with_inputs(gate_runner(H, fn, base, scale, norm_w, spec), H, fn, base, scale, norm_w)


def _scores(spec, pools: int, device) -> Callable:
    """One row's index scores over `pools` pools (the indexer's heads, replicated at every TP): a program a block of
    16 pools, as the layer's SCORE tasks take them (kinds/layer/table.py `BP`; `scores_runner`)."""
    ix, rnd = spec.indexer, _random(pools, device)
    qi, w = rnd(1, ix.heads, ix.head_dim), rnd(1, ix.heads, scale=ix.heads**-0.5)
    pooled = rnd(1, pools, ix.head_dim, dtype=torch.bfloat16)
    P = torch.tensor([pools])
    return _with_inputs(scores_runner(qi, w, pooled, P, spec, block=16), qi, w, pooled, P)


def _mla_attention(spec, heads: int, device) -> Callable:
    """One row's sparse MLA over the index width of selected tokens (every one valid), for `heads` heads (a rank's:
    64 / TP): the token blocks' log-sum-exp partials, then their combine (`sparse_mla_launch`: the layer's MLA
    attention and combine tasks)."""
    C, width, rnd = spec.mla.kv_lora_rank, spec.index_width, _random(heads, device)
    q, latent = rnd(1, heads, C, dtype=torch.bfloat16), rnd(1, 2 * width, C, dtype=torch.bfloat16)
    g = torch.Generator(device="cpu").manual_seed(heads)
    idx = torch.randperm(2 * width, generator=g)[:width].sort().values[None].to(device, torch.int32)
    scale = mla_scale(spec)
    return _with_inputs(lambda: sparse_mla_launch(q, latent, idx, scale), q, latent, idx, scale)


OPS = {
    "select": OpBench(
        "the exact top-k of a row's pools and their tokens (ops/dsa/select.py: four radix passes and the take)",
        "pools",
        (256, 1024, 4096, 16384, 32768),
        _select,
        5,
    ),
    **{
        f"select{k}": OpBench(
            f"the same top-k with {k} of its radix passes as launches, each part's take finding the threshold's "
            f"other digits over every pool's key (knob select_passes={k})",
            "pools",
            (256, 1024, 4096),
            lambda spec, pools, device, k=k: _select(spec, pools, device, passes=k),
            k + 1,
            most=LOCAL_POOLS,
        )
        for k in (3, 2, 1, 0)
    },
    "route": OpBench(
        "the routing: each row's top-k experts from its router logits (ops/ffn/moe.py, a program a row)",
        "rows",
        (1, 2, 4, 8),
        _route,
        1,
        most=8,
    ),
    "kda_head": OpBench(
        "the KDA core of one row's heads: conv, gate, delta rule, gated norm (ops/kda/kernel.py, a program a head)",
        "heads",
        (8, 16, 64),
        _kda_head,
        1,
    ),
    "gate": OpBench(
        "the mHC gate as the layer lays it out: the mix tasks (a row and 128 columns each), then the gate tasks (x̂ a "
        "chunk each, the Sinkhorn comb) (kinds/layer/shared.py, two launches)",
        "rows",
        (1, 2, 4, 8),
        _gate,
        2,
        most=16,
    ),
    "scores": OpBench(
        "the indexer's scores of one row's pools (ops/dsa/indexer.py, a program a block of 16 pools)",
        "pools",
        (1024, 4096, 16384, 32768),
        _scores,
        1,
    ),
    "mla_attention": OpBench(
        "one row's sparse MLA over the selected tokens and the blocks' combine (ops/dsa/attend.py, two launches)",
        "heads",
        (8, 16),
        _mla_attention,
        2,
    ),
}


def time_op(name: str, spec, size: int, rounds: int, device: str = "cuda") -> dict:
    """One op at one size: µs per call (its plain launches in a CUDA graph; the median over replays)."""
    run = OPS[name].make(spec, size, device)
    t = measure.graph_time(run, inner=20, rounds=rounds)
    return {"op": name, OPS[name].unit: size, "size": size, "us": t.median_us, "rounds_us": t.rounds_us}
