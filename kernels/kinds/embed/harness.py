"""One key of `embed` with its peers, as `check`, `fault`, `run`, `build` and `bench` use it (kinds/__init__.py).

A TP-T launch runs rank 0's shard; ranks 1..T-1's partials, which its all-reduce reads, come first from the
same kernel in `partial_only` mode on those ranks' shards, in same-GPU buffers (docs/design.md §3).
"""

from __future__ import annotations

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.embed.launch import EmbedLaunch
from glm53ctl.kernels.kinds.harness import Inputs, KindHarness, Timed, bf16_numerics, nbytes
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.embed.naive import embed_partial, streams
from glm53ctl.kernels.ops.embed.tasks import EMBED_GATHER, EMBED_REDUCE
from glm53ctl.kernels.weights import ROOT, Weights


class EmbedHarness(KindHarness):
    kind = "embed"
    input_name = "tokens"
    Launch = EmbedLaunch
    STAGES = ((EMBED_GATHER,), (EMBED_REDUCE,))

    def __init__(self, weights: Weights, key: ResolvedKey, layer=None) -> None:
        super().__init__(weights, key)
        spec, tp, rows, device = self.spec, self.tp, self.rows, self.device
        self.shards = [self.shard(f"{ROOT}embed_tokens.weight", r) for r in range(tp)]
        self.launch = self.scheduled(EmbedLaunch(spec, tp, rows, self.knobs, device))
        self.peers = [EmbedLaunch(spec, tp, rows, self.knobs, device, partial_only=True) for _ in range(1, tp)]

    def peer_partials(self, x: torch.Tensor) -> torch.Tensor | None:
        """Ranks 1..T-1's partials [T-1, R, D] for the token ids x: what the all-reduce reads."""
        if self.tp == 1:
            return None
        x = x.to(self.device)
        return torch.stack([p(x, self.shards[r], rank=r) for r, p in enumerate(self.peers, start=1)]).contiguous()

    def __call__(self, x: torch.Tensor, peers=None, poison: bool = False, **guard) -> dict[str, torch.Tensor]:
        x = x.to(self.device)
        peers = self.peer_partials(x) if peers is None and self.tp > 1 else peers
        out = None
        if poison:
            R, D = self.rows, self.spec.hidden
            out = torch.full((R, self.spec.mhc.streams, D), float("nan"), dtype=torch.bfloat16, device=self.device)
        return {"H": self.launch(x, self.shards[0], peers, out=out, **guard)}

    def writes(self) -> dict[str, torch.Tensor]:
        """Its hand-off buffer: the fp32 partial."""
        return {"partial": self.launch.partial.cpu().clone()}

    def token_sets(self, n: int) -> list[dict]:
        """n sets of token ids, every one in rank 0's rows of the table (so its launch gathers every row), the
        first the harness's own draw: what bench rotates, since one launch reads only R rows of the table."""
        gen = torch.Generator().manual_seed(n)
        v_local = self.shards[0].shape[0]
        sets = [torch.randint(0, v_local, (self.rows,), generator=gen) for _ in range(n)]
        return [{"tokens": t.to(self.device)} for t in sets]

    def timed(self, x: torch.Tensor, peers: torch.Tensor | None) -> Timed:
        """Rank 0's launch over sets of token ids its shard holds; it moves R rows of the table, the peers'
        partials, its own partial (written and read) and H."""
        launch, table = self.launch, self.shards[0]
        R, D, hc = self.rows, self.spec.hidden, self.spec.mhc.streams
        out = torch.empty(R, hc, D, dtype=torch.bfloat16, device=self.device)
        call = lambda c: launch(c["tokens"], table, peers, out=out, check=False)
        row_bytes = R * D * table.element_size()
        moved = row_bytes + 2 * R * D * 4 + nbytes(out) + (nbytes(peers) if peers is not None else 0)
        return Timed(
            call,
            self.token_sets,
            row_bytes,
            moved,
            "token ids (each set gathers R other rows; the table's rows warm in the L2)",
            out,
        )

    def stock(self, x: torch.Tensor, peers: torch.Tensor | None) -> Timed:
        """Rank 0's embedding as stock PyTorch ops in bf16, the peers' partials added."""

        num, table, hc = bf16_numerics(), self.shards[0], self.spec.mhc.streams
        others = list(peers.unbind(0)) if peers is not None else []

        def call(c):
            h = embed_partial(c["tokens"], table, 0, num)
            for p in others:
                h = h + p.to(h.dtype)
            return streams(h, hc, num)

        t = self.timed(x, peers)
        return Timed(call, self.token_sets, t.stream_bytes, t.nbytes, t.what)

    def inputs(self, seed: int, steps: int = 1, tokens: tuple[int, ...] | None = None) -> list[torch.Tensor]:
        gen = Inputs(self.spec, seed, FP32)
        return [gen.tokens(self.rows, tokens if s == steps - 1 else None) for s in range(steps)]

    def reference(self, x) -> dict[str, torch.Tensor]:
        return self.reference_model().embed(x)
