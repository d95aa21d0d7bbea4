"""`bench --gpus T`: a key's launch timed on T real ranks, one process per GPU, beside the one-device emulation.

Each rank builds its part of the key (kernels/kinds/*/ranks.py `rank_part`: its shards, its mailboxes, its
schedule) on the key's inputs and compiles it before the ranks first meet; then per round every rank meets the
others at a barrier, launches `launches` times back to back (`RankPart.timed`: unchecked, nothing copied back)
and waits for its device. A round's time per launch is its slowest rank's (a launch on real peers ends when its
last rank's does); the figure is the median over the rounds. After the rounds every rank checks its launches'
guards: a launch that faulted is no timing (the run fails, naming the rank).

The command refuses on a CPU (exit 2: the interpreter's times mean nothing); the tests run this same code on a
CPU under the interpreter, with the host's clock, to prove everything but the GPU's timing.
"""

from __future__ import annotations

import time

import torch

from glm53ctl.kernels.kinds import load_ranks
from glm53ctl.kernels.runtime.ranks import RankLayout, WeightsSource, compile_on_rank, given_to_ranks, run_ranks
from glm53ctl.kernels.spec import load_model

# back-to-back launches per round on the ranks (a launch is tens to thousands of µs: one round is milliseconds)
LAUNCHES = 20


def time_on_ranks(key, x, rounds: int, launches: int = LAUNCHES, source=None, timeout_s: float = 1800.0) -> dict:
    """`key` (resolved) on key.tp real ranks from input x (a harness's input, on the CPU): µs per launch (the
    median over `rounds` of the slowest rank's), each rank's median, and the rounds' figures."""

    layout = RankLayout(key.tp, key.tp, torch.device(key.device).type)
    per_rank = run_ranks(layout, _time_rank, key, given_to_ranks(x), rounds, launches, source, timeout_s=timeout_s)
    per_round = [max(r[i] for r in per_rank) for i in range(rounds)]
    return {
        "us": _median(per_round),
        "per_rank_us": [_median(r) for r in per_rank],
        "rounds_us": per_round,
        "launches_per_round": launches,
    }


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _time_rank(group, key, x, rounds: int, launches: int, source) -> list[float]:
    """On one rank: its part of the key, compiled, then `rounds` rounds of `launches` launches; µs per launch
    per round."""

    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    fn = load_ranks(key.kind)
    room = getattr(fn, "room", lambda x: ())(x)  # the caches' size a kind that reads caches is built for
    part = fn.rank_part(group, key, weights, *room)
    compile_on_rank(group, part.launch)
    call, _ = part.timed(x)
    cuda = group.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    group.barrier()
    call()  # the first launch (a CPU run's caches warm), untimed
    sync()
    out = []
    for _ in range(rounds):
        group.barrier()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(launches):
                call()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / launches)
        else:
            t0 = time.perf_counter()
            for _ in range(launches):
                call()
            out.append((time.perf_counter() - t0) * 1e6 / launches)
    group.barrier()
    for la in part.launch if isinstance(part.launch, list) else [part.launch]:
        la.runtime.check()  # a launch that faulted is no timing: its LaunchFault fails the run, naming the rank
    return out
