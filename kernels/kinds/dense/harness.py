"""One key of `dense` with its peers, as `check`, `fault`, `run`, `build` and `bench` use it (kinds/__init__.py).

A TP-T launch runs rank 0's shard; the peers' partials come first from partial launches of the same kernel
on ranks 1..T-1's shards, in two phases, in same-GPU buffers (docs/design.md §3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.harness import (
    Inputs,
    KindHarness,
    RunKey,
    Timed,
    bf16_numerics,
    cloned,
    layer_for,
    layer_state,
    nbytes,
    row_contexts,
)
from glm53ctl.kernels.kinds.layer.launch import LayerLaunch
from glm53ctl.kernels.kinds.layer.table import STAGES
from glm53ctl.kernels.kinds.layer.weights import prepare_weights
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.ffn.naive import swiglu_mlp
from glm53ctl.kernels.ops.kda.naive import kda_attention
from glm53ctl.kernels.ops.mhc.naive import gate, hc_post
from glm53ctl.kernels.reference import DecodeState, Reference, conv_join, conv_slice, head_slice, room
from glm53ctl.kernels.runtime.ranks import steps_on_ranks
from glm53ctl.kernels.state import KdaState
from glm53ctl.kernels.weights import Weights


@dataclass
class LayerInput:
    """A layer launch's input: the streams H [R, hc, D] bf16 and the layer's KDA state before the step
    (TP-independent: all heads; conv bf16, recurrent fp32)."""

    H: torch.Tensor
    state: KdaState

    def to(self, device) -> LayerInput:
        return LayerInput(self.H.to(device), KdaState(self.state.conv.to(device), self.state.recurrent.to(device)))


def rank_state(x: LayerInput, rank: int, tp: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank's slices of the state: its q, k and v conv channels and its heads (contiguous, on device)."""
    conv = conv_slice(x.state.conv, rank, tp).to(device, torch.bfloat16).contiguous()
    rec = head_slice(x.state.recurrent, rank, tp).to(device, torch.float32).contiguous()
    return conv, rec


@dataclass
class DensePeers:
    """What the other ranks contribute to rank 0's launch: their partials [T, R, D] and their state writes."""

    parts_a: torch.Tensor
    parts_f: torch.Tensor
    writes: list[tuple[torch.Tensor, torch.Tensor]]  # (conv, recurrent) of ranks 1..T-1


class DenseHarness(KindHarness):
    """The `dense` launch of one key with its peers. Rank 0 runs the whole layer; the other ranks' partials
    come from the same kernel on their shards in two phases, as the all-reduces need them: every rank's
    attention partial first, then each peer's FFN partial given all attention partials."""

    kind = "dense"
    input_name = "H"
    STAGES = STAGES
    Launch = LayerLaunch
    FFN = "dense"  # the FFN half: the dense MLP here, the MoE in kda (kinds/kda)

    def __init__(self, weights: Weights, key: ResolvedKey, layer=None) -> None:
        super().__init__(weights, key)
        spec, knobs, tp, rows, device = self.spec, self.knobs, self.tp, self.rows, self.device
        self.layer = layer_for(spec, self.kind, layer)
        fold = key.norm_folds
        ffn = self.FFN
        src = weights.source_layer(self.layer)
        self.w = [
            weights.prepared(
                (src, r, tp, str(device), fold, ffn, "kda"),
                lambda r=r: prepare_weights(weights.layer(self.layer, r, tp), spec, tp, device, fold, ffn),
            )
            for r in range(tp)
        ]
        self.launch = self.scheduled(LayerLaunch(spec, tp, rows, knobs, device, ffn=ffn))
        if tp > 1:
            self.attn = [LayerLaunch(spec, tp, rows, knobs, device, rank=q, mode="attn", ffn=ffn) for q in range(tp)]
            self.ffn = [LayerLaunch(spec, tp, rows, knobs, device, rank=q, mode="ffn", ffn=ffn) for q in range(1, tp)]

    @classmethod
    def build_launches(cls, spec, key: ResolvedKey) -> list[tuple[str, object]]:
        # a peer's partial launches (its attention half, its FFN half) differ from rank 0's in the task table and
        # runtime arguments only, but the table's size is specialized on (Peers.words): built too
        mk = lambda **kw: LayerLaunch(spec, key.tp, key.rows, key.knobs, "cpu", ffn=cls.FFN, **kw)  # noqa: E731
        peers = [(f"peer.{m}", mk(rank=1, mode=m)) for m in ("attn", "ffn")] if key.tp > 1 else []
        return cls.scheduled_builds(key, [("launch", mk())] + peers)

    def rank_state(self, x: LayerInput, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        return rank_state(x, rank, self.tp, self.device)

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
            written = self.run_peer(launch, x, q)
            parts_a[q] = launch.buf["parts_a"][q]
            if q and written is not None:
                writes.append(written)
        for q, launch in enumerate(self.ffn, start=1):
            launch.set_peers(parts_a=parts_a)
            self.run_peer(launch, x, q)
            parts_f[q] = launch.buf["parts_f"][q]
        return DensePeers(parts_a, parts_f, writes)

    def run_peer(self, launch, x: LayerInput, q: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One partial launch of rank q on its shard of x's state; its state writes (conv, recurrent)."""
        launch(x.H, self.w[q], *self.rank_state(x, q))
        return launch.conv_out.clone(), launch.S_out.clone()

    def ready(self, x, peers, poison: bool):
        """Rank 0's launch made ready for x: x on the device, the peers' partials (run here unless given) set, the
        outputs poisoned if asked. Returns x, the peers and the launch."""
        x = x.to(self.device)
        peers = self.peer_partials(x) if peers is None and self.tp > 1 else peers
        launch = self.launch
        if peers is not None:
            launch.set_peers(peers.parts_a, peers.parts_f)
        if poison:
            launch.poison()
        return x, peers, launch

    def __call__(self, x: LayerInput, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        """One launch of rank 0 (after the peers' partials): every output and the whole layer's state writes."""
        x, peers, launch = self.ready(x, peers, poison)
        out = {n: t.clone() for n, t in launch(x.H, self.w[0], *self.rank_state(x, 0), **guard).items()}
        writes = [(launch.conv_out, launch.S_out)] + (peers.writes if peers is not None else [])
        out["kda.conv"] = conv_join([c for c, _ in writes])
        out["kda.recurrent"] = torch.cat([s for _, s in writes], dim=1)
        return out

    def reference(self, x: LayerInput) -> dict[str, torch.Tensor]:
        """The reference layer at this TP width on the launch's inputs: its outputs and its state writes."""
        i = self.layer
        state = DecodeState(
            torch.zeros(self.rows, dtype=torch.long), 1, {i: KdaState(x.state.conv.float(), x.state.recurrent)}
        )
        out, new = self.reference_model().layer(i, x.H.float(), state)
        return out | {"kda.conv": new.kda[i].conv, "kda.recurrent": new.kda[i].recurrent}

    def timed(self, x: LayerInput, peers: DensePeers | None) -> Timed:
        """Rank 0's launch on copies of its weights; it moves every weight it reads, the KDA states read and
        written, H, the peers' partials (attention and FFN) and its outputs."""
        x = x.to(self.device)
        launch = self.launch
        if peers is not None:
            launch.set_peers(peers.parts_a, peers.parts_f)
        conv, S = self.rank_state(x, 0)
        w = self.w[0]
        moved = nbytes(*w.values()) + 2 * nbytes(conv, S) + nbytes(x.H) + nbytes(*launch.out.values())
        moved += 2 * (self.tp - 1) * self.rows * self.spec.hidden * 4
        call = lambda c: launch(x.H, c, conv, S, check=False)
        return Timed(call, cloned(w), nbytes(*w.values()), moved, "rank 0's layer weights", launch.out["H"])

    def stock(self, x: LayerInput, peers: DensePeers | None) -> Timed:
        """Rank 0's share of the layer as stock PyTorch ops in bf16 (the reference's ops), the peers' partials
        given: the `torch` and `compile` baselines."""

        spec, num = self.spec, bf16_numerics()
        x = x.to(self.device)
        H = x.H
        attention = self.stock_attention(x)
        parts_a = list(peers.parts_a[1:].to(torch.bfloat16)) if peers is not None else []
        parts_f = list(peers.parts_f[1:].to(torch.bfloat16)) if peers is not None else []
        w0 = self.stock_weights()
        attn_w = lambda w: {n.removeprefix("self_attn."): t for n, t in w.items() if n.startswith("self_attn.")}

        def call(w, H=H):
            xh, post, comb = gate(
                H, w["hc_attn_fn"], w["hc_attn_base"], w["hc_attn_scale"], w["input_layernorm.weight"], spec, num
            )
            a = attention(xh, attn_w(w), num)
            for p in parts_a:
                a = a + p
            H1 = hc_post(a, H, post, comb, num)
            norm = w["post_attention_layernorm.weight"]
            xh, post, comb = gate(H1, w["hc_ffn_fn"], w["hc_ffn_base"], w["hc_ffn_scale"], norm, spec, num)
            m = self.stock_ffn(xh, w, num)
            for p in parts_f:
                m = m + p
            return hc_post(m, H1, post, comb, num)

        moved = self.timed(x, peers).nbytes
        return Timed(call, cloned(w0), nbytes(*w0.values()), moved, "rank 0's layer weights")

    def stock_attention(self, x: LayerInput):
        """The attention half of `stock` on x's state: (x̂, the attention weights, numerics) -> rank 0's partial."""

        conv, S = (t.to(torch.bfloat16) for t in self.rank_state(x, 0))
        return lambda xh, w, num: kda_attention(xh, w, KdaState(conv, S), self.spec, num)[0]

    def stock_weights(self) -> dict[str, torch.Tensor]:
        """Rank 0's layer weights under the checkpoint's names, on the device: what `stock` reads (and rotates)."""
        return {n: t.to(self.device) for n, t in self.weights.layer(self.layer, 0, self.tp).items()}

    def stock_ffn(self, xh, w: dict, num):
        """The FFN half of `stock`: the dense MLP (rank 0's share)."""

        limit = self.spec.moe.swiglu_limit
        return swiglu_mlp(xh, w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"], w["mlp.down_proj.weight"], limit, num)

    def inputs(self, seed: int, steps: int = 1, tokens=None) -> list[LayerInput]:
        """Seeded H and a random layer state per step (fresh draws: every row at its own state)."""
        gen = Inputs(self.spec, seed, FP32)
        return [LayerInput(gen.H(self.rows).to(torch.bfloat16), gen.kda_state(self.rows)) for _ in range(steps)]

    @classmethod
    def run(cls, weights: Weights, key: RunKey, resolved: ResolvedKey) -> dict[str, torch.Tensor]:
        """`run --backend triton`: run_reference's inputs (the same draws: the layer's state prefilled to each
        row's context, then H per step) through the launch, each step's state writes read by the next."""
        k = cls(weights, resolved, layer=key.layer)
        contexts, xs = cls.step_inputs(weights, key, k.layer)
        states = [xs[0].state]  # each step's state before it, then the last step's writes
        for x in xs:
            out = k(LayerInput(x.H, states[-1]))
            states.append(KdaState(out.pop("kda.conv").float().cpu(), out.pop("kda.recurrent").cpu()))
        return cls.run_saved(k.layer, contexts, key, xs[-1].H, states[-2], out, states[-1])

    @classmethod
    def run_ranks(
        cls, weights: Weights, key: RunKey, resolved: ResolvedKey, source, rank_fn
    ) -> dict[str, torch.Tensor]:
        """`run --backend triton --gpus T`: `run`'s steps on T real ranks, each rank carrying its slices of the
        state from step to step; what `run` saves (the state before the last step and its writes joined from
        the ranks' slices, rank 0's outputs), and every rank's outputs and state slices as `ranks.<r>.*`."""
        i = layer_for(weights.spec, cls.kind, key.layer)
        contexts, xs = cls.step_inputs(weights, key, i)
        out = steps_on_ranks(rank_fn, resolved, xs, source)

        def joined(step: int) -> KdaState:
            parts = [out[r][step] for r in range(resolved.tp)]
            conv = conv_join([p["kda.conv"] for p in parts]).float()
            return KdaState(conv, torch.cat([p["kda.recurrent"] for p in parts], dim=1))

        before = joined(-2) if len(xs) > 1 else xs[0].state
        last = {n: t.clone() for n, t in out[0][-1].items() if not n.startswith("kda.")}
        saved = cls.run_saved(i, contexts, key, xs[-1].H, before, last, joined(-1))
        return saved | {f"ranks.{r}.{n}": t for r in range(resolved.tp) for n, t in out[r][-1].items()}

    @classmethod
    def step_inputs(cls, weights: Weights, key: RunKey, layer: int) -> tuple[list[int], list[LayerInput]]:
        """A run's rows' contexts and its steps' inputs: H per step, and (every step's, the first's to read) the
        layer's state prefilled by the reference to each row's context."""
        spec = weights.spec
        inputs = Inputs(spec, key.seed, FP32)
        contexts = row_contexts(key.context, key.rows, spec.indexer.kpool)
        slots = room(spec, max(contexts) + key.steps)
        state = layer_state(Reference(weights), layer, contexts, inputs, slots).kda[layer]
        return contexts, [LayerInput(inputs.H(key.rows).to(torch.bfloat16), state) for _ in range(key.steps)]

    @staticmethod
    def run_saved(layer: int, contexts, key: RunKey, H, before: KdaState, out: dict, after: KdaState) -> dict:
        """What `run` saves: the inputs of the last step (H, the state before it), its outputs and its writes."""
        pre = f"layers.{layer}.kda."
        return (
            {"inputs.contexts": torch.tensor(contexts), "inputs.H": H, "inputs.layer": torch.tensor(layer)}
            | {"inputs.pos": torch.tensor(contexts) + key.steps - 1}
            | {f"inputs.state.{pre}conv": before.conv, f"inputs.state.{pre}recurrent": before.recurrent}
            | {f"outputs.{n}": t.cpu() for n, t in out.items()}
            | {f"writes.{pre}conv": after.conv, f"writes.{pre}recurrent": after.recurrent}
        )
