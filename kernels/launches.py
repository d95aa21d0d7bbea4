"""The Triton launches of each kind on one device, fed the same seeded inputs as the reference.

A TP-T launch runs rank 0's shard; the peers' partials it reduces or gathers are computed first by the
same kernels on ranks 1..T-1's shards (`partial_only` for embed and tail; for dense, partial launches in
two phases), in same-GPU buffers (DESIGN.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glm53ctl.errors import UsageError
from glm53ctl.kernels.gemv import folds
from glm53ctl.kernels.harness import Inputs, RunKey, layer_for, row_contexts
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.state import KdaState
from glm53ctl.kernels.weights import ROOT, Weights
from glm53ctl.tuning.knobs import knobs_for, resolve_grid

TRITON_KINDS = ("embed", "dense", "tail")


class KindLaunch:
    """The launch of one key (kind, tp, rows, knobs) with its peers' partials; callable per step."""

    def __init__(self, weights: Weights, kind: str, tp: int, rows: int, knobs: dict | None, device) -> None:
        if kind not in ("embed", "tail"):
            raise UsageError(
                f"the Triton backend has no {kind} launch yet", hint=f"kinds with kernels: {', '.join(TRITON_KINDS)}"
            )
        spec = weights.spec
        spec.check_tp(tp)
        knobs = resolve_grid(knobs_for(spec.name, kind, tp, rows, knobs, device), device)
        self.kind, self.tp, self.rows, self.knobs, self.device = kind, tp, rows, knobs, torch.device(device)
        self.spec, self.weights = spec, weights
        w = lambda name, r: weights.shard(name, r, tp).to(self.device).contiguous()
        if kind == "embed":
            from glm53ctl.kernels.embed.kernel import EmbedLaunch

            name = f"{ROOT}embed_tokens.weight"
            self.shards = [w(name, r) for r in range(tp)]
            self.launch = EmbedLaunch(spec, tp, rows, knobs, device)
            self.peers = [EmbedLaunch(spec, tp, rows, knobs, device, partial_only=True) for _ in range(1, tp)]
        else:
            from glm53ctl.kernels.tail.kernel import TailLaunch

            self.norm = weights.shard(f"{ROOT}norm.weight").to(self.device)
            self.launch = TailLaunch(spec, tp, rows, knobs, device)
            self.shards = [self.launch.prepare_lm_head(self.norm, w("lm_head.weight", r)) for r in range(tp)]
            self.peers = [TailLaunch(spec, tp, rows, knobs, device, partial_only=True) for _ in range(1, tp)]

    def peer_partials(self, x: torch.Tensor) -> torch.Tensor | None:
        """Ranks 1..T-1's partials for input x (tokens or H), stacked: what the all-reduce/gather reads."""
        if self.tp == 1:
            return None
        if self.kind == "embed":
            parts = [p(x, self.shards[r], rank=r) for r, p in enumerate(self.peers, start=1)]
        else:
            parts = [p(x, self.norm, self.shards[r]) for r, p in enumerate(self.peers, start=1)]
        return torch.stack(parts).contiguous()

    def __call__(self, x: torch.Tensor, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        """One launch (after the peers' partials): every output of the kind. poison: the outputs start
        as NaN, so an element the launch does not write fails every check."""
        x = x.to(self.device)
        peers = self.peer_partials(x) if peers is None and self.tp > 1 else peers
        R, D = self.rows, self.spec.hidden
        if self.kind == "embed":
            out = torch.full((R, self.spec.mhc.streams, D), float("nan"), dtype=torch.bfloat16, device=self.device)
            return {"H": self.launch(x, self.shards[0], peers, out=out if poison else None, **guard)}
        logits = None
        if poison:
            self.launch.h_hat.fill_(float("nan"))
            logits = torch.full((R, self.launch.width), float("nan"), device=self.device)
        logits = self.launch(x, self.norm, self.shards[0], peers, out=logits, **guard)
        return {"h_hat": self.launch.h_hat[: self.rows].clone(), "logits": logits}

    def inputs(self, seed: int, steps: int = 1, tokens: tuple[int, ...] | None = None) -> list[torch.Tensor]:
        """The same seeded inputs the reference draws for this kind (one per step)."""
        gen = Inputs(self.spec, seed, FP32)
        if self.kind == "embed":
            return [gen.tokens(self.rows, tokens if s == steps - 1 else None) for s in range(steps)]
        return [gen.H(self.rows).to(torch.bfloat16) for _ in range(steps)]


def run_triton(weights: Weights, key: RunKey, knobs: dict | None = None, device="cpu") -> dict[str, torch.Tensor]:
    """`glm53ctl run --backend triton`: the saved tensors of run_reference's layout for this kind."""
    if key.rows not in range(1, 9):
        raise UsageError(f"rows {key.rows} is out of range 1..8")
    if key.kind == "dense":
        return _run_dense(weights, key, knobs, device)
    if key.kind not in TRITON_KINDS:
        raise UsageError(
            f"the Triton backend has no {key.kind} launch yet", hint=f"kinds with kernels: {', '.join(TRITON_KINDS)}"
        )
    k = KindLaunch(weights, key.kind, key.tp, key.rows, knobs, device)
    xs = k.inputs(key.seed, key.steps, key.tokens)
    for x in xs:
        out = k(x)
    saved = {"inputs.contexts": torch.tensor(row_contexts(key.context, key.rows, weights.spec.indexer.kpool))}
    saved["inputs.tokens" if key.kind == "embed" else "inputs.H"] = xs[-1].cpu()
    return saved | {f"outputs.{n}": t.cpu() for n, t in out.items()}


def make_launch(weights: Weights, kind: str, tp: int, rows: int, knobs: dict | None, device):
    """The launch harness of one key: KindLaunch for embed and tail, DenseKind for dense."""
    if kind == "dense":
        return DenseKind(weights, tp, rows, knobs, device)
    return KindLaunch(weights, kind, tp, rows, knobs, device)


@dataclass
class LayerInput:
    """A layer launch's input: the streams H [R, hc, D] bf16 and the layer's KDA state before the step
    (TP-independent: all heads; conv bf16, recurrent fp32)."""

    H: torch.Tensor
    state: KdaState

    def to(self, device) -> LayerInput:
        return LayerInput(self.H.to(device), KdaState(self.state.conv.to(device), self.state.recurrent.to(device)))


@dataclass
class DensePeers:
    """What the other ranks contribute to rank 0's launch: their partials [T, R, D] and their state writes."""

    parts_a: torch.Tensor
    parts_f: torch.Tensor
    writes: list[tuple[torch.Tensor, torch.Tensor]]  # (conv, recurrent) of ranks 1..T-1


class DenseKind:
    """The `dense` launch of one key with its peers. Rank 0 runs the whole layer; the other ranks' partials
    come from the same kernel on their shards in two phases, as the all-reduces need them: every rank's
    attention partial first, then each peer's FFN partial given all attention partials."""

    kind = "dense"

    def __init__(self, weights: Weights, tp: int, rows: int, knobs: dict | None, device, layer=None) -> None:
        from glm53ctl.kernels.dense.kernel import DenseLaunch, prepare_weights

        spec = weights.spec
        spec.check_tp(tp)
        knobs = resolve_grid(knobs_for(spec.name, "dense", tp, rows, knobs, device), device)
        self.tp, self.rows, self.knobs, self.device = tp, rows, knobs, torch.device(device)
        self.spec, self.weights = spec, weights
        self.layer = layer_for(spec, "dense", layer)
        fold = folds(knobs["norm"], rows, spec.mhc.streams)
        self.w = [prepare_weights(weights.layer(self.layer, r, tp), spec, tp, device, fold) for r in range(tp)]
        self.launch = DenseLaunch(spec, tp, rows, knobs, device)
        if tp > 1:
            self.attn = [DenseLaunch(spec, tp, rows, knobs, device, rank=q, mode="attn") for q in range(tp)]
            self.ffn = [DenseLaunch(spec, tp, rows, knobs, device, rank=q, mode="ffn") for q in range(1, tp)]

    def rank_state(self, x: LayerInput, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank's slices of the state: its q, k and v conv channels and its heads (contiguous, on device)."""
        from glm53ctl.kernels.reference import conv_slice, head_slice

        conv = conv_slice(x.state.conv, rank, self.tp).to(self.device, torch.bfloat16).contiguous()
        rec = head_slice(x.state.recurrent, rank, self.tp).to(self.device, torch.float32).contiguous()
        return conv, rec

    def peer_partials(self, x: LayerInput) -> DensePeers | None:
        if self.tp == 1:
            return None
        x = x.to(self.device)
        T, R, D = self.tp, self.rows, self.spec.hidden
        parts_a = torch.zeros(T, R, D, device=self.device)
        parts_f = torch.zeros(T, R, D, device=self.device)
        writes = []
        for q, launch in enumerate(self.attn):
            launch.poison()  # a state element a peer's launch leaves alone fails every check too
            launch(x.H, self.w[q], *self.rank_state(x, q))
            parts_a[q] = launch.buf["parts_a"][q]
            if q:
                writes.append((launch.conv_out.clone(), launch.S_out.clone()))
        for q, launch in enumerate(self.ffn, start=1):
            launch.set_peers(parts_a=parts_a)
            launch(x.H, self.w[q], *self.rank_state(x, q))
            parts_f[q] = launch.buf["parts_f"][q]
        return DensePeers(parts_a, parts_f, writes)

    def __call__(self, x: LayerInput, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        """One launch of rank 0 (after the peers' partials): every output and the whole layer's state writes."""
        from glm53ctl.kernels.reference import conv_join

        x = x.to(self.device)
        peers = self.peer_partials(x) if peers is None and self.tp > 1 else peers
        launch = self.launch
        if peers is not None:
            launch.set_peers(peers.parts_a, peers.parts_f)
        if poison:
            launch.poison()
        out = {n: t.clone() for n, t in launch(x.H, self.w[0], *self.rank_state(x, 0), **guard).items()}
        writes = [(launch.conv_out, launch.S_out)] + (peers.writes if peers is not None else [])
        out["kda.conv"] = conv_join([c for c, _ in writes])
        out["kda.recurrent"] = torch.cat([s for _, s in writes], dim=1)
        return out

    def inputs(self, seed: int, steps: int = 1) -> list[LayerInput]:
        """Seeded H and a random layer state per step (fresh draws: every row at its own state)."""
        gen = Inputs(self.spec, seed, FP32)
        return [LayerInput(gen.H(self.rows).to(torch.bfloat16), gen.kda_state(self.rows)) for _ in range(steps)]


def _run_dense(weights: Weights, key: RunKey, knobs: dict | None, device) -> dict[str, torch.Tensor]:
    """`run --backend triton` for dense: run_reference's inputs (the same draws: the layer's state prefilled to
    each row's context, then H per step) through the launch, each step's state writes read by the next."""
    from glm53ctl.kernels.harness import layer_state
    from glm53ctl.kernels.reference import Reference, room

    spec = weights.spec
    k = DenseKind(weights, key.tp, key.rows, knobs, device, layer=key.layer)
    i = k.layer
    inputs = Inputs(spec, key.seed, FP32)
    contexts = row_contexts(key.context, key.rows, spec.indexer.kpool)
    state = layer_state(Reference(weights), i, contexts, inputs, room(spec, max(contexts) + key.steps)).kda[i]
    for _ in range(key.steps):
        x = LayerInput(inputs.H(key.rows).to(torch.bfloat16), state)
        out = k(x)
        state = KdaState(out.pop("kda.conv").float().cpu(), out.pop("kda.recurrent").cpu())
    pre = f"layers.{i}.kda."
    return (
        {"inputs.contexts": torch.tensor(contexts), "inputs.H": x.H, "inputs.layer": torch.tensor(i)}
        | {"inputs.pos": torch.tensor(contexts) + key.steps - 1}
        | {f"inputs.state.{pre}conv": x.state.conv, f"inputs.state.{pre}recurrent": x.state.recurrent}
        | {f"outputs.{n}": t.cpu() for n, t in out.items()}
        | {f"writes.{pre}conv": state.conv, f"writes.{pre}recurrent": state.recurrent}
    )
