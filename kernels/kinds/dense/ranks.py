"""`dense` and `kda` on real ranks (kernels/runtime/ranks.py): what one rank's process runs.

Each rank runs the whole layer on its shard (its KDA heads, its columns of the MLP or its share of every
expert) and its slice of the state; before each all-reduce its OWN tasks push its partial into every peer's
mailbox and tag it (two groups of flag words: the attention's, the FFN's), and its reduces sum every rank's in
rank order, as the emulation's do: every rank's outputs are the emulation's bit for bit. The routing is
computed on every rank from the same x̂: the same experts everywhere. In the stage schedule (knob `launch`) the
rank runs the kind's stages, the pushes in the stage of the tiles they push (runtime/stages.py `on_rank`).
"""

from __future__ import annotations

from glm53ctl.kernels.kinds import load_harness
from glm53ctl.kernels.kinds.dense.harness import rank_state
from glm53ctl.kernels.kinds.layer.launch import LayerLaunch
from glm53ctl.kernels.kinds.layer.table import push_stages
from glm53ctl.kernels.kinds.layer.weights import prepare_weights
from glm53ctl.kernels.kinds.run_key import layer_for
from glm53ctl.kernels.reference import conv_slice, head_slice
from glm53ctl.kernels.runtime.ranks import PeerLinks, RankPart, WeightsSource, launches_on_rank
from glm53ctl.kernels.runtime.stages import on_rank
from glm53ctl.kernels.spec import load_model


def rank_launches(group, key, inputs: list, mute: list, budget_ns, source=None, chain: bool = False):
    """One rank of a TP-`tp` dense or kda layer: its weights, its mailboxes, its launch; one launch per
    LayerInput in `inputs` (H and the whole layer's state: the rank takes its slices). `mute[i]`: the rank that
    never tags its pushes at launch i (-1: none). Per launch its outputs and its slices of the state writes
    (`rank_view` of the emulation's), or its fault, in words. `chain` (a run's steps): a launch after the first
    reads the state its rank's launch before wrote, not the input's."""

    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    launch, run, *_ = rank_part(group, key, weights, chain=chain)
    return launches_on_rank(group, launch, run, inputs, mute, budget_ns)


def rank_part(group, key, weights, layer: int | None = None, name: str | None = None, chain: bool = False):
    """This rank's launch of layer `layer` (None: the kind's own) of a dense or kda key, its shard of `weights`
    and its mailboxes `name`, as a `RankPart`: run(x) with x a LayerInput; `chain`: each launch after the first
    (until `reset`) reads the state this rank's launch before wrote."""

    spec, tp, rows, rank = load_model(key.model), key.tp, key.rows, group.rank
    dev = group.device
    knobs = key.knobs  # resolved where the command started the key (its grid for this device type)
    ffn = "moe" if key.kind == "kda" else "dense"
    layer = layer_for(spec, key.kind, layer)
    w = prepare_weights(weights.layer(layer, rank, tp), spec, tp, dev, key.norm_folds, ffn)
    links = PeerLinks.open(group, name or key.kind, LayerLaunch.mailbox_shapes(spec, tp, rows, knobs, ffn=ffn))
    launch = on_rank(
        LayerLaunch(spec, tp, rows, knobs, dev, rank=rank, ffn=ffn, links=links),
        push_stages(load_harness(key.kind).stages(knobs)),
    )
    state = []  # chained: this rank's slices of the state its last launch wrote

    def run(x, mute_: bool, budget):
        x = x.to(dev)
        launch.poison()
        conv, rec = state[-1] if state else rank_state(x, rank, tp, dev)
        out = launch(x.H, w, conv, rec, mute=mute_, budget_ns=budget)
        if chain:
            state[:] = [(launch.conv_out.clone(), launch.S_out.clone())]
        return {n: t.cpu().clone() for n, t in out.items()} | {
            "kda.conv": launch.conv_out.cpu().clone(),
            "kda.recurrent": launch.S_out.cpu().clone(),
        }

    def timed(x):
        x = x.to(dev)
        conv, rec = rank_state(x, rank, tp, dev)
        return (lambda: launch(x.H, w, conv, rec, check=False)), launch.out["H"]

    return RankPart(launch, run, state.clear, timed)


def rank_view(out: dict, rank: int, tp: int) -> dict:
    """What rank `rank` returns of the emulation's outputs `out`: every output as it is (replicated), and its
    slices of the layer's state writes."""

    conv, rec = conv_slice(out["kda.conv"], rank, tp), head_slice(out["kda.recurrent"], rank, tp)
    return out | {"kda.conv": conv, "kda.recurrent": rec}


rank_launches.rank_view = rank_view
rank_launches.rank_part = rank_part
