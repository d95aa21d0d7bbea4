"""`model` on real ranks (kernels/runtime/ranks.py): what one rank's process runs.

A rank runs the whole step on its shards: every part is its own kind's launch on this rank (each kind's
`rank_part`: embed's gather and all-reduce, each layer pushing both all-reduces' partials to its peers, tail's
all-gather), chained on the rank as the one-device step chains them: embed's H is the first layer's input, each
layer's H the next one's, the last one's the tail's. Every layer keeps its own state from step to step (its
slices of the KDA state; a DSA layer's caches, which every rank writes) and has mailboxes of its own, named by
the part, so a part's peer words are read against its own launch's tag only.
"""

from __future__ import annotations

from glm53ctl.kernels.kinds import get_kind, load_ranks
from glm53ctl.kernels.kinds.dense.harness import LayerInput
from glm53ctl.kernels.kinds.model.step import SHAPE_KIND, ModelInput, cache_writes, written_at
from glm53ctl.kernels.kinds.sparse.harness import CACHE_NAMES, SparseInput
from glm53ctl.kernels.reference import conv_slice, head_slice
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.ranks import RankPart, WeightsSource, compile_on_rank, launches_on_rank
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.state import DsaCache


def rank_launches(group, key, inputs: list, mute: list, budget_ns, source=None):
    """One rank of a TP-`tp` step: every part's launch on this rank's shards; per ModelInput in `inputs` its
    steps (x.tokens[s] the ids of step s) from x's states, each layer's state carried from step to step. Per
    input the last step's outputs (as the one-device step names them; every layer's H, routing and selection,
    the logits), this rank's slices of every KDA layer's state and every DSA layer's written cache slots, or its
    first part's fault, in words. `mute[i]`: the rank whose embed never publishes in input i's first step. A part
    that faults does not stop the step: every later part still launches (on NaN rows), so every part's launch tag
    advances alike on every rank and the next input's step is clean."""

    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    launches, run, _, _ = rank_part(group, key, weights, caches_room(inputs[0]))
    return launches_on_rank(group, launches, run, inputs, mute, budget_ns)


def caches_room(x) -> int:
    """The tokens a step's input's DSA caches have room for (what its launches are built for); 0 without any."""
    return next(iter(x.dsa.values())).latent.shape[1] if x.dsa else 0


def rank_part(group, key, weights, slots: int, keep_caches: bool = False):
    """This rank's step (every part's launch on its shards, caches of `slots` tokens) as a `RankPart`: its
    launches in step order; run(x) with x a ModelInput, its steps from x's states (rank_launches says what
    comes back; `keep_caches`: every DSA layer's whole caches after them as `layers.<i>.cache.<name>`, not the
    slots written; `fresh=False`: on from the states the last call left, x's positions those of its first step);
    timed(x) the step's first step, each part reading the one before's output buffer."""
    import torch

    spec = load_model(key.model)
    part = lambda kind: load_ranks(kind).rank_part  # noqa: E731
    parts = [("embed", part("embed")(group, key.part("embed"), weights, name="embed"))]
    for i, shape in enumerate(spec.layers):
        kind, name = SHAPE_KIND[shape], f"layers.{i}"
        room = (slots,) if get_kind(kind).reads_context else ()
        parts.append((name, part(kind)(group, key.part(kind), weights, *room, layer=i, name=name, chain=True)))
        weights.drop_raw()  # the layer keeps its prepared shards: a rank's raw ones too would not fit a GPU
    parts.append(("tail", part("tail")(group, key.part("tail"), weights, name="tail")))
    kpool = spec.indexer.kpool

    def reset() -> None:
        for _, p in parts:
            p.reset()  # every layer's next step reads its input's states

    def run(x, mute_: bool, budget, fresh: bool = True):
        if fresh:
            reset()
        pos0 = x.pos.long()
        steps = x.tokens.shape[0]
        rows = torch.full((key.rows, spec.mhc.streams, spec.hidden), float("nan"), dtype=torch.bfloat16)
        faults = []

        def launch(p, x_part, mute_part: bool = False) -> dict:
            """A part's launch; after a fault, NaN rows for the parts after it (their launches still run)."""
            try:
                return p.run(x_part, mute_part, budget)
            except LaunchFault as e:
                faults.append(e)
                return {"H": rows}

        for s in range(steps):
            H = launch(parts[0][1], x.tokens[s], mute_ and s == 0)["H"]
            out = {"embed.H": H}
            for name, p in parts[1:-1]:
                i = int(name.split(".")[1])
                if i in x.dsa:
                    o = launch(p, SparseInput(H, pos0 + s, x.dsa[i]))
                    out[f"{name}.dsa.idx"] = o.get("dsa.idx")
                    out |= {f"{name}.cache.{n}": o.get(f"cache.{n}") for n in CACHE_NAMES}
                else:
                    o = launch(p, LayerInput(H, x.kda[i]))
                    out |= {f"{name}.kda.{n}": o.get(f"kda.{n}") for n in ("conv", "recurrent")}
                out |= {f"{name}.{n}": o[n] for n in ("moe.ids", "moe.weights") if n in o}
                H = o["H"]
                out[f"{name}.H"] = H
            out |= launch(parts[-1][1], H)
        if faults:
            raise faults[0]
        # a DSA layer's writes: the slots the steps wrote of its caches after them, as the one-device step's
        at = written_at(pos0, steps, kpool)
        for i in [] if keep_caches else x.dsa:
            caches = DsaCache(*(out.pop(f"layers.{i}.cache.{n}") for n in CACHE_NAMES))
            out |= cache_writes(i, caches, at)
        return {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in out.items()}

    def timed(x):
        calls = []
        call, H = parts[0][1].timed(x.tokens[0])
        calls.append(call)
        for name, p in parts[1:-1]:
            i = int(name.split(".")[1])
            xin = SparseInput(H, x.pos, x.dsa[i]) if i in x.dsa else LayerInput(H, x.kda[i])
            call, H = p.timed(xin)
            calls.append(call)
        call, logits = parts[-1][1].timed(H)
        calls.append(call)

        def step() -> None:
            for c in calls:
                c()

        return step, logits

    return RankPart([p.launch for _, p in parts], run, reset, timed)


def greedy_on_rank(group, key, x0, steps: int, source=None) -> dict:
    """`run --gpus T --kind model`: one rank of `steps` greedy steps from x0's states (x0.tokens[0] the first
    step's ids; each next step's the argmax of the logits, which every rank has whole after tail's all-gather, so
    every rank picks the same), each layer's state carried. Returns every step's token ids and the outputs of the
    last two steps (its last step's, and the one before whose writes are the last step's states), on rank 0
    every DSA layer's whole caches among them."""
    import torch

    weights = (source or WeightsSource()).load(load_model(key.model), group.device)
    # rank 0's whole caches come back (every rank writes the same): the others send only the slots written
    launches, run, _, _ = rank_part(group, key, weights, caches_room(x0), keep_caches=group.rank == 0)
    compile_on_rank(group, launches)
    tokens, last = x0.tokens[:1], []
    for s in range(steps):
        group.barrier()
        out = run(ModelInput(tokens[-1:], x0.pos + s, x0.kda, x0.dsa), False, None, fresh=s == 0)
        last = (last + [out])[-2:]
        tokens = torch.cat([tokens, out["logits"].argmax(-1)[None]])
    return {"tokens": tokens[:steps], "last": last}


def rank_view(out: dict, rank: int, tp: int) -> dict:
    """What rank `rank` returns of the one-device step's outputs `out`: every output as it is, and of every KDA
    layer's state writes its slices (kernels/kinds/dense/ranks.py `rank_view`)."""

    view = dict(out)
    for n, t in out.items():
        if n.endswith(".kda.conv"):
            view[n] = conv_slice(t, rank, tp)
        elif n.endswith(".kda.recurrent"):
            view[n] = head_slice(t, rank, tp)
    return view


rank_launches.rank_view = rank_view
rank_launches.rank_part = rank_part
rank_launches.room = lambda x: (caches_room(x),)  # rank_part's caches, sized as an input's
