"""`sparse` on real ranks (kernels/runtime/ranks.py): what one rank's process runs.

As `dense` and `kda` (kernels/kinds/dense/ranks.py): each rank runs the whole layer on its shard (its MLA heads,
its share of every expert) and pushes its partials to its peers before each all-reduce. The indexer, its
selection, the caches' writes and the routing are replicated: every rank computes them from the same inputs, and
every rank's are the emulation's bit for bit (what `check --gpus` proves of each).
"""

from __future__ import annotations

from glm53ctl.kernels.kinds import load_harness
from glm53ctl.kernels.kinds.layer.launch import LayerLaunch
from glm53ctl.kernels.kinds.layer.table import push_stages
from glm53ctl.kernels.kinds.layer.weights import prepare_weights
from glm53ctl.kernels.kinds.run_key import layer_for
from glm53ctl.kernels.kinds.sparse.harness import CACHE_NAMES, written_rows
from glm53ctl.kernels.runtime.ranks import PeerLinks, RankPart, WeightsSource, launches_on_rank
from glm53ctl.kernels.runtime.stages import on_rank
from glm53ctl.kernels.spec import load_model


def rank_launches(group, key, inputs: list, mute: list, budget_ns, source=None, chain: bool = False):
    """One rank of a TP-`tp` sparse layer: its weights, its mailboxes, its launch; one launch per SparseInput in
    `inputs` (H, the rows' positions and the caches, on a copy of them). `mute[i]`: the rank that never tags its
    pushes at launch i (-1: none). Per launch its outputs and the caches' rows it wrote, or its fault, in words.
    `chain` (a run's steps): a launch after the first reads the caches its rank's launch before wrote, one
    position on, and returns the whole caches (`cache.<name>`) beside its outputs."""

    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    # the caches' capacity (a compile-time constant) as the inputs' caches have it: a check's room for one
    # launch, a run's for its steps
    launch, run, *_ = rank_part(group, key, weights, inputs[0].cache.latent.shape[1], chain=chain)
    return launches_on_rank(group, launch, run, inputs, mute, budget_ns)


def rank_part(group, key, weights, slots: int, layer: int | None = None, name: str | None = None, chain=False):
    """This rank's launch of DSA layer `layer` (None: the kind's own) of a sparse key, its shard of `weights`,
    caches of `slots` tokens and its mailboxes `name`, as a `RankPart`: run(x) with x a SparseInput; `chain`:
    each launch after the first (until `reset`) reads the caches this rank's launch before wrote, one position
    on."""
    import torch

    spec, tp, rows, rank = load_model(key.model), key.tp, key.rows, group.rank
    dev = group.device
    knobs = key.knobs  # resolved where the command started the key (its grid for this device type)
    w = prepare_weights(weights.layer(layer_for(spec, "sparse", layer), rank, tp), spec, tp, dev, False, "moe", "mla")
    halves = {"ffn": "moe", "attn": "mla", "slots": slots}
    links = PeerLinks.open(group, name or "sparse", LayerLaunch.mailbox_shapes(spec, tp, rows, knobs, **halves))
    launch = on_rank(
        LayerLaunch(spec, tp, rows, knobs, dev, rank=rank, links=links, **halves),
        push_stages(load_harness(key.kind).stages(knobs)),
    )
    state = []  # chained: the caches and positions this rank's last launch wrote at and read

    def run(x, mute_: bool, budget):
        x = x.to(dev)
        cache, pos = state[-1] if state else (x.clone_cache(), x.pos)
        launch.poison()
        launch(x.H, w, cache, pos.to(torch.int32), mute=mute_, budget_ns=budget)
        out = {n: t.cpu().clone() for n, t in launch.out.items()}
        out |= {n: t.cpu().clone() for n, t in written_rows(cache, pos, spec.indexer.kpool).items()}
        if chain:
            state[:] = [(cache, pos + 1)]
            out |= {f"cache.{n}": getattr(cache, n).cpu().clone() for n in CACHE_NAMES}
        return out

    def timed(x):
        x = x.to(dev)
        cache, pos = x.clone_cache(), x.pos.to(torch.int32)  # each launch writes the same slots
        return (lambda: launch(x.H, w, cache, pos, check=False)), launch.out["H"]

    return RankPart(launch, run, state.clear, timed)


rank_launches.rank_part = rank_part
rank_launches.room = lambda x: (x.cache.latent.shape[1],)  # rank_part's caches, sized as an input's
