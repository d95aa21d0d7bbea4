"""One key of `tail` with its peers, as `check`, `fault`, `run`, `build` and `bench` use it (kinds/__init__.py).

A TP-T launch runs rank 0's shard and gathers ranks 1..T-1's logits, made first by the same kernel in
`partial_only` mode on those ranks' shards, in same-GPU buffers (docs/design.md §3).
"""

from __future__ import annotations

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.harness import Inputs, KindHarness, Timed, bf16_numerics, cloned, nbytes
from glm53ctl.kernels.kinds.tail.launch import TailLaunch
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.tail.naive import final_norm, logits_shard
from glm53ctl.kernels.ops.tail.tasks import TAIL_GATHER, TAIL_LM_HEAD, TAIL_NORM
from glm53ctl.kernels.weights import ROOT, Weights


class TailHarness(KindHarness):
    kind = "tail"
    input_name = "H"
    Launch = TailLaunch
    STAGES = ((TAIL_NORM,), (TAIL_LM_HEAD, TAIL_GATHER))

    def __init__(self, weights: Weights, key: ResolvedKey, layer=None) -> None:
        super().__init__(weights, key)
        spec, tp, rows, device = self.spec, self.tp, self.rows, self.device
        self.norm = weights.shard(f"{ROOT}norm.weight").to(self.device)
        self.launch = self.scheduled(TailLaunch(spec, tp, rows, self.knobs, device))
        self.shards = [self.launch.prepare_lm_head(self.norm, self.shard("lm_head.weight", r)) for r in range(tp)]
        self.peers = [TailLaunch(spec, tp, rows, self.knobs, device, partial_only=True) for _ in range(1, tp)]

    def peer_partials(self, x: torch.Tensor) -> torch.Tensor | None:
        """Ranks 1..T-1's logits [T-1, R, V/T] for the streams x: what the gather reads."""
        if self.tp == 1:
            return None
        x = x.to(self.device)
        return torch.stack([p(x, self.norm, self.shards[r]) for r, p in enumerate(self.peers, start=1)]).contiguous()

    def __call__(self, x: torch.Tensor, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        x = x.to(self.device)
        peers = self.peer_partials(x) if peers is None and self.tp > 1 else peers
        logits = None
        if poison:
            self.launch.h_hat.fill_(float("nan"))
            logits = torch.full((self.rows, self.launch.width), float("nan"), device=self.device)
        logits = self.launch(x, self.norm, self.shards[0], peers, out=logits, **guard)
        return {"h_hat": self.launch.h_hat[: self.rows].clone(), "logits": logits}

    def timed(self, x: torch.Tensor, peers: torch.Tensor | None) -> Timed:
        """Rank 0's launch on copies of its lm_head shard; it moves the shard, H, the norm weight, the peers'
        logits and the logits it writes."""
        x, launch = x.to(self.device), self.launch
        out = torch.empty(self.rows, launch.width, dtype=torch.float32, device=self.device)
        call = lambda c: launch(x, self.norm, c["lm_head"], peers, out=out, check=False)
        moved = nbytes(self.shards[0], x, self.norm, out) + (nbytes(peers) if peers is not None else 0)
        lm = {"lm_head": self.shards[0]}
        return Timed(call, cloned(lm), nbytes(self.shards[0]), moved, "rank 0's lm_head", out)

    def stock(self, x: torch.Tensor, peers: torch.Tensor | None) -> Timed:
        """Rank 0's tail as stock PyTorch ops in bf16, the peers' logits gathered."""

        x, num, eps = x.to(self.device), bf16_numerics(), self.spec.model.rms_norm_eps
        others = list(peers.unbind(0)) if peers is not None else []

        def call(w, x=x):
            h_hat = final_norm(x, self.norm, eps, num)
            return torch.cat([logits_shard(h_hat, w["lm_head"], num).float(), *others], dim=-1)

        lm = self.shard("lm_head.weight", 0)
        return Timed(call, cloned({"lm_head": lm}), nbytes(lm), self.timed(x, peers).nbytes, "rank 0's lm_head")

    def inputs(self, seed: int, steps: int = 1, tokens=None) -> list[torch.Tensor]:
        gen = Inputs(self.spec, seed, FP32)
        return [gen.H(self.rows).to(torch.bfloat16) for _ in range(steps)]

    def reference(self, x) -> dict[str, torch.Tensor]:
        return self.reference_model().tail(x.float())
