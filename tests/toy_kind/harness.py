"""One key of the toy kind, as `check`, `fault`, `build` and `run` use it; and its reference run."""

from __future__ import annotations

import torch

from glm53ctl.kernels.harness import KindHarness, row_contexts
from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.task_types import HOP
from tests.toy_kind import WIDTH
from tests.toy_kind.launch import ToyLaunch


def draw(rows: int, seed: int, steps: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, WIDTH, generator=gen) for _ in range(steps)]


def reference(x: torch.Tensor) -> dict[str, torch.Tensor]:
    y = 2 * x.float()
    return {"y": y, "total": y.sum(-1)}


def run_reference(ref, key) -> dict[str, torch.Tensor]:
    """`glm53ctl run`'s reference run: the layout the Triton run saves (KindHarness.run)."""
    x = draw(key.rows, key.seed, key.steps)[-1]
    contexts = torch.tensor(row_contexts(key.context, key.rows, ref.spec.indexer.kpool))
    return {"inputs.contexts": contexts, "inputs.x": x} | {f"outputs.{n}": t for n, t in reference(x).items()}


class ToyHarness(KindHarness):
    kind = "toy"
    input_name = "x"
    Launch = ToyLaunch
    STAGES = ((HOP,),)

    def __init__(self, weights, key: ResolvedKey, layer=None) -> None:
        super().__init__(weights, key)
        self.launch = ToyLaunch(self.spec, self.tp, self.rows, self.knobs, self.device)

    @classmethod
    def build_launches(cls, spec, key: ResolvedKey) -> list[tuple[str, object]]:
        return [("launch", ToyLaunch(spec, key.tp, key.rows, key.knobs, "cpu"))]

    def inputs(self, seed: int, steps: int = 1, tokens=None) -> list[torch.Tensor]:
        return draw(self.rows, seed, steps)

    def peer_partials(self, x):
        return None  # no peers' share: every rank doubles its own rows

    def __call__(self, x, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        x = x.to(self.device).contiguous()
        fill = float("nan") if poison else 0.0
        y = torch.full((self.rows, WIDTH), fill, device=self.device)
        total = torch.full((self.rows,), fill, device=self.device)
        self.launch(x, y, total, **guard)
        return {"y": y, "total": total}

    def reference(self, x) -> dict[str, torch.Tensor]:
        return reference(x.cpu())
