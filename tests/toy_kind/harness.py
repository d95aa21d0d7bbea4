"""One key of the toy kind, as `check`, `fault`, `build` and `run` use it; and its reference run."""

from __future__ import annotations

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.harness import KindHarness, row_contexts
from tests.toy_kind import WIDTH
from tests.toy_kind.launch import ToyLaunch
from tests.toy_op.tasks import DOUBLE, SUM


def draw(rows: int, seed: int, steps: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, WIDTH, generator=gen) for _ in range(steps)]


def reference(x: torch.Tensor) -> dict[str, torch.Tensor]:
    y = 2 * x.float()
    return {"y": y, "top": y.argmax(-1).int(), "total": y.sum(-1)}


def run_reference(ref, key) -> dict[str, torch.Tensor]:
    """`glm53ctl run`'s reference run: the layout the Triton run saves (KindHarness.run)."""
    x = draw(key.rows, key.seed, key.steps)[-1]
    contexts = torch.tensor(row_contexts(key.context, key.rows, ref.spec.indexer.kpool))
    return {"inputs.contexts": contexts, "inputs.x": x} | {f"outputs.{n}": t for n, t in reference(x).items()}


class ToyHarness(KindHarness):
    kind = "toy"
    input_name = "x"
    Launch = ToyLaunch
    STAGES = ((DOUBLE, SUM),)

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
        top = torch.full((self.rows,), -1, dtype=torch.int32, device=self.device)
        total = torch.full((self.rows,), fill, device=self.device)
        self.launch(x, y, top, total, **guard)
        return {"y": y, "top": top, "total": total}

    def invariants(self, out: dict, ref: dict) -> dict[str, bool]:
        """`top` has no bound (ties would move it): each written one must name its row's largest doubled value
        (one never written is `check`'s own finding)."""
        y, top = out["y"].cpu(), out["top"].cpu().long()
        written = top != -1
        inside = bool((top[written] < WIDTH).all() & (top[written] >= 0).all())
        picked = y.gather(1, top.clamp(0, WIDTH - 1)[:, None])[:, 0]
        largest = inside and bool((picked == y.max(1).values)[written].all())
        return {"every top is its row's largest": largest}

    def reference(self, x) -> dict[str, torch.Tensor]:
        return reference(x.cpu())
