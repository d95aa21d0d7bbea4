"""The `embed` launch of one build key: its table and buffers laid out once; each call is one launch."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds.embed.kernel import embed_kernel
from glm53ctl.kernels.kinds.embed.table import build_table
from glm53ctl.kernels.ops.embed.naive import check_tokens
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime


class EmbedLaunch(PersistentLaunch):
    """One build key of `embed` (rank 0 of TP `tp`, or with partial_only a rank's partial alone)."""

    kernel = embed_kernel

    def __init__(self, spec, tp: int, rows: int, knobs: dict, device, partial_only: bool = False) -> None:
        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.D, self.v_local = spec.hidden, spec.shards(tp).vocab
        self.chunk = min(knobs["chunk"], self.D)
        self.partial_only = partial_only
        self.table = build_table(self.D, self.chunk, tp, knobs["handoff"], partial_only)
        self.grid = knobs["grid"]
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid)
        self.partial = torch.zeros(rows, self.D, dtype=torch.float32, device=device)

    def kernel_args(self, tokens, table, peer_partials, H, rank=0, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS):
        return self.runtime_args(stuck_site, budget_ns) | {
            "tokens": tokens,
            "table": table,
            "partial": self.partial,
            "peer_partials": peer_partials,
            "H": H,
            "R": self.rows,
            "vocab_offset": rank * self.v_local,
        }

    def constexprs(self) -> dict:
        return self.runtime_constexprs() | {
            "D": self.D,
            "HC": self.spec.mhc.streams,
            "V_LOCAL": self.v_local,
            "TP": 1 if self.partial_only else self.tp,
            "CHUNK": self.chunk,
        }

    def __call__(self, tokens, table, peer_partials=None, rank=0, out=None, stuck_site=-1, budget_ns=None, check=True):
        """H [R, hc, D] bf16 (or with partial_only, this rank's fp32 partial [R, D])."""
        R, D = self.rows, self.D
        assert tokens.shape == (R,) and table.shape == (self.v_local, D) and table.is_contiguous()
        if not (tokens.is_cuda and torch.cuda.is_current_stream_capturing()):  # a graph cannot sync
            check_tokens(tokens.cpu(), self.spec.model.vocab_size)
        tokens = tokens.to(torch.int32)
        if not self.partial_only and self.tp > 1:
            assert peer_partials is not None and peer_partials.shape == (self.tp - 1, R, D)
        H = (
            out
            if out is not None
            else torch.empty(R, self.spec.mhc.streams, D, dtype=torch.bfloat16, device=table.device)
        )
        peers = peer_partials if peer_partials is not None else self.partial
        args = self.kernel_args(tokens, table, peers, H, rank, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        self.launch(args, check)
        return self.partial.clone() if self.partial_only else H

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        i32, bf16, f32 = (torch.empty(1, dtype=d) for d in (torch.int32, torch.bfloat16, torch.float32))
        return self.kernel_args(i32, bf16, f32, bf16)
