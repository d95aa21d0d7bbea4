"""The Triton launches of each kind on one device, fed the same seeded inputs as the reference.

A TP-T launch runs rank 0's shard; the peers' partials it reduces or gathers are computed first by the
same kernels on ranks 1..T-1's shards (`partial_only`), in same-GPU buffers (DESIGN.md §3).
"""

from __future__ import annotations

import torch

from glm53ctl.errors import UsageError
from glm53ctl.kernels.harness import Inputs, RunKey, row_contexts
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.weights import ROOT, Weights
from glm53ctl.tuning.knobs import knobs_for, resolve_grid

TRITON_KINDS = ("embed", "tail")


class KindLaunch:
    """The launch of one key (kind, tp, rows, knobs) with its peers' partials; callable per step."""

    def __init__(self, weights: Weights, kind: str, tp: int, rows: int, knobs: dict | None, device) -> None:
        if kind not in TRITON_KINDS:
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
            self.shards = [w("lm_head.weight", r) for r in range(tp)]
            self.launch = TailLaunch(spec, tp, rows, knobs, device)
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
    k = KindLaunch(weights, key.kind, key.tp, key.rows, knobs, device)
    xs = k.inputs(key.seed, key.steps, key.tokens)
    for x in xs:
        out = k(x)
    saved = {"inputs.contexts": torch.tensor(row_contexts(key.context, key.rows, weights.spec.indexer.kpool))}
    saved["inputs.tokens" if key.kind == "embed" else "inputs.H"] = xs[-1].cpu()
    return saved | {f"outputs.{n}": t.cpu() for n, t in out.items()}
