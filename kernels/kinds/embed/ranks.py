"""`embed` on real ranks (kernels/runtime/ranks.py): what one rank's process runs."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds import load_harness
from glm53ctl.kernels.kinds.embed.launch import EmbedLaunch
from glm53ctl.kernels.runtime.ranks import PeerLinks, RankPart, WeightsSource, launches_on_rank
from glm53ctl.kernels.runtime.stages import on_rank
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import ROOT


def rank_launches(group, key, tokens: list, mute: list, budget_ns, source=None):
    """One rank of a TP-`tp` embed: its shard of the table, its mailboxes, its launch; one launch per row of
    token ids in `tokens`. `mute[i]`: the rank that never publishes at launch i (fault injection; -1: none). Per
    launch its outputs ({"H": on the CPU}) or its fault, in words."""

    # `source` (WeightsSource) None: drawn on the rank's device type, as the emulation's (a CPU and a GPU draw
    # other numbers)
    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    launch, run, *_ = rank_part(group, key, weights)
    return launches_on_rank(group, launch, run, tokens, mute, budget_ns)


def rank_part(group, key, weights, name: str = "embed"):
    """This rank's embed launch (its shard of `weights`' table, its mailboxes `name`) as a `RankPart`: run(ids)
    with ids a row of token ids (a list or a tensor)."""

    spec, tp, rows = load_model(key.model), key.tp, key.rows
    dev = group.device
    full = key.knobs  # resolved where the command started the key (its grid for this device type)
    table = weights.shard(f"{ROOT}embed_tokens.weight", group.rank, tp)
    table = table.to(dev).contiguous()
    links = PeerLinks.open(group, name, EmbedLaunch.mailbox_shapes(spec, tp, rows, full))
    launch = on_rank(EmbedLaunch(spec, tp, rows, full, dev, links=links), load_harness("embed").STAGES)

    def run(ids, mute_: bool, budget):
        H = torch.full((rows, spec.mhc.streams, spec.hidden), float("nan"), dtype=torch.bfloat16, device=dev)
        launch(torch.as_tensor(ids, device=dev), table, out=H, mute=mute_, budget_ns=budget)
        return {"H": H.cpu()}

    def timed(ids):
        ids = torch.as_tensor(ids, device=dev)
        H = torch.empty((rows, spec.mhc.streams, spec.hidden), dtype=torch.bfloat16, device=dev)
        return (lambda: launch(ids, table, out=H, check=False)), H

    return RankPart(launch, run, timed=timed)


rank_launches.rank_part = rank_part
