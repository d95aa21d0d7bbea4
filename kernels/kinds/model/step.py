"""What a step takes and writes, shared by the step's one-device harness (harness.py) and its real ranks
(ranks.py): its inputs, which kind runs each layer shape, and where its DSA caches were written."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glm53ctl.kernels.kinds import LAYER_KINDS
from glm53ctl.kernels.kinds.sparse.harness import CACHE_NAMES
from glm53ctl.kernels.state import DsaCache, KdaState

SHAPE_KIND = {shape: kind for kind, shape in LAYER_KINDS.items()}


@dataclass
class ModelInput:
    """A step's inputs: token ids [steps, R] (one row of ids per step), every row's position before the first
    step, every KDA layer's state (all heads: conv bf16, recurrent fp32) and every DSA layer's caches (bf16)."""

    tokens: torch.Tensor
    pos: torch.Tensor
    kda: dict[int, KdaState]
    dsa: dict[int, DsaCache]

    def to(self, device) -> ModelInput:
        kda = {i: KdaState(s.conv.to(device), s.recurrent.to(device)) for i, s in self.kda.items()}
        dsa = {i: DsaCache(*(getattr(c, n).to(device) for n in CACHE_NAMES)) for i, c in self.dsa.items()}
        return ModelInput(self.tokens.to(device), self.pos.to(device), kda, dsa)


def written_at(pos0: torch.Tensor, steps: int, kpool: int) -> list[tuple]:
    """Per step from the rows' positions pos0, the rows, their cache slot and the pool slot each writes (a pool
    completing; else the last one)."""
    rows = torch.arange(pos0.shape[0], device=pos0.device)
    return [(rows, pos0 + s, ((pos0 + s + 1) // kpool - 1).clamp(min=0)) for s in range(steps)]


def cache_writes(layer: int, cache: DsaCache, at: list[tuple]) -> dict[str, torch.Tensor]:
    """Of DSA layer `layer`'s caches after the steps, the slots they wrote (`written_at`): [R, steps, ...]."""
    out = {}
    for n in CACHE_NAMES:
        t = getattr(cache, n)
        out[f"layers.{layer}.dsa.{n}"] = torch.stack([t[r, (q if n == "pooled_key" else p)] for r, p, q in at], 1)
    return out
