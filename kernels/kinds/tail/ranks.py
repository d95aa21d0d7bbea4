"""`tail` on real ranks (kernels/runtime/ranks.py): what one rank's process runs."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds import load_harness
from glm53ctl.kernels.kinds.tail.launch import TailLaunch
from glm53ctl.kernels.runtime.ranks import PeerLinks, RankPart, WeightsSource, launches_on_rank
from glm53ctl.kernels.runtime.stages import on_rank
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import ROOT


def rank_launches(group, key, streams: list, mute: list, budget_ns, source=None):
    """One rank of a TP-`tp` tail: its lm_head shard, its mailboxes, its launch; one launch per H in `streams`
    (nested lists of bf16 values). `mute[i]`: the rank that never publishes at launch i (-1: none). Per launch
    its outputs ({"h_hat", "logits"}: every rank the full logits) or its fault, in words."""

    # `source` (WeightsSource) None: as the emulation's (drawn on the rank's device type: a CPU and a GPU draw
    # other numbers)
    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    launch, run, *_ = rank_part(group, key, weights)
    return launches_on_rank(group, launch, run, streams, mute, budget_ns)


def rank_part(group, key, weights, name: str = "tail"):
    """This rank's tail launch (its lm_head shard of `weights`, its mailboxes `name`) as a `RankPart`: run(H)
    with H the streams (nested lists of bf16 values, or a tensor)."""

    spec, tp, rows = load_model(key.model), key.tp, key.rows
    dev = group.device
    full = key.knobs  # resolved where the command started the key (its grid for this device type)
    links = PeerLinks.open(group, name, TailLaunch.mailbox_shapes(spec, tp, rows, full))
    launch = on_rank(TailLaunch(spec, tp, rows, full, dev, links=links), load_harness("tail").STAGES)
    norm = weights.shard(f"{ROOT}norm.weight").to(dev)
    lm_w = launch.prepare_lm_head(norm, weights.shard("lm_head.weight", group.rank, tp).to(dev).contiguous())

    def run(h, mute_: bool, budget):
        H = torch.as_tensor(h, dtype=torch.bfloat16, device=dev)
        logits = torch.full((rows, launch.width), float("nan"), device=dev)
        launch.h_hat.fill_(float("nan"))
        launch(H, norm, lm_w, out=logits, mute=mute_, budget_ns=budget)
        return {"h_hat": launch.h_hat[:rows].cpu().clone(), "logits": logits.cpu()}

    def timed(h):
        H = torch.as_tensor(h, dtype=torch.bfloat16, device=dev)
        logits = torch.empty((rows, launch.width), device=dev)
        return (lambda: launch(H, norm, lm_w, out=logits, check=False)), logits

    return RankPart(launch, run, timed=timed)


rank_launches.rank_part = rank_part
