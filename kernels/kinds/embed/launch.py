"""The `embed` launch of one build key: its table and buffers laid out once; each call is one launch."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds.base import KnobRecord
from glm53ctl.kernels.kinds.embed.kernel import embed_kernel
from glm53ctl.kernels.kinds.embed.table import build_table
from glm53ctl.kernels.ops.embed.naive import check_tokens
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime
from glm53ctl.kernels.runtime.ranks import PeerLinks


class EmbedLaunch(PersistentLaunch):
    """One build key of `embed` (rank 0 of TP `tp`, or with partial_only a rank's partial alone; with `links`,
    one rank of real ranks, in its own process, pushing its partial to its peers' mailboxes)."""

    kernel = embed_kernel

    def __init__(
        self, spec, tp: int, rows: int, knobs: KnobRecord, device, partial_only: bool = False,
        links: PeerLinks | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.D, self.v_local = spec.hidden, spec.shards(tp).vocab
        self.chunk = min(knobs.chunk, self.D)
        self.partial_only = partial_only
        self.links = links
        peer_ranks = [q for q in range(tp) if q != links.rank] if links else None
        self.table = build_table(self.D, self.chunk, tp, knobs.handoff, partial_only, peer_ranks)
        self.grid = knobs.grid
        flags = links.flags.local if links else None
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid, flags=flags)
        self.peer_words = self.table.n_tasks  # where the peers' words start in every rank's flag mailbox
        if links:
            self.partial = links.slots.local
        else:
            self.partial = torch.zeros(rows, self.D, dtype=torch.float32, device=device)
        self.arrive = torch.zeros(1, dtype=torch.int32, device=device)  # the pushing tasks' arrivals (real ranks)
        self._no_peers = torch.zeros(1, dtype=torch.int64, device=device)

    @staticmethod
    def mailbox_shapes(spec, tp: int, rows: int, knobs: KnobRecord) -> dict[str, tuple[int, ...]]:
        """The mailboxes real ranks make before their launches (PeerLinks)."""
        D = spec.hidden
        n_tasks = build_table(D, min(knobs.chunk, D), tp, knobs.handoff, False, list(range(tp - 1))).n_tasks
        return {"slots": (2, tp, rows, D), "flags": (n_tasks + tp - 1,)}

    def kernel_args(
        self, tokens, table, peer_partials, H, rank=0, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS, mute=False
    ):
        links = self.links
        args = self.runtime_args(stuck_site, budget_ns) | {
            "tokens": tokens,
            "table": table,
            "partial": self.partial,
            "peer_partials": peer_partials,
            "H": H,
            "peer_slots": links.slots.bases if links else self._no_peers,
            "peer_flags": links.flags.bases if links else self._no_peers,
            "arrive": self.arrive,
            "R": self.rows,
            "rank": rank,
            "mute": int(mute),
            "vocab_offset": rank * self.v_local,
            "peer_words": self.peer_words,
        }
        if links:
            args["n_peers"] = 0  # the peers write their own words: the last program leaves them alone
        return args

    def constexprs(self) -> dict:
        return self.runtime_constexprs() | {
            "D": self.D,
            "HC": self.spec.mhc.streams,
            "V_LOCAL": self.v_local,
            "TP": 1 if self.partial_only else self.tp,
            "CHUNK": self.chunk,
            "REMOTE": self.links is not None,
        }

    def __call__(
        self,
        tokens,
        table,
        peer_partials=None,
        rank=0,
        out=None,
        stuck_site=-1,
        budget_ns=None,
        check=True,
        mute=False,
    ):
        """H [R, hc, D] bf16 (or with partial_only, this rank's fp32 partial [R, D]). With real ranks (`links`)
        the peers' partials come through the mailboxes (`peer_partials` None) and `mute` never publishes this
        rank's tag (fault injection)."""
        if self.links is not None:
            rank = self.links.rank
        R, D = self.rows, self.D
        assert tokens.shape == (R,) and table.shape == (self.v_local, D) and table.is_contiguous()
        if not (tokens.is_cuda and torch.cuda.is_current_stream_capturing()):  # a graph cannot sync
            check_tokens(tokens.cpu(), self.spec.model.vocab_size)
        tokens = tokens.to(torch.int32)
        if not self.partial_only and self.tp > 1 and self.links is None:
            assert peer_partials is not None and peer_partials.shape == (self.tp - 1, R, D)
        H = (
            out
            if out is not None
            else torch.empty(R, self.spec.mhc.streams, D, dtype=torch.bfloat16, device=table.device)
        )
        peers = peer_partials if peer_partials is not None else self.partial
        args = self.kernel_args(tokens, table, peers, H, rank, stuck_site, budget_ns or DEFAULT_BUDGET_NS, mute)
        self.launch(args, check)
        return self.partial.clone() if self.partial_only else H

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        i32, bf16, f32 = (torch.empty(1, dtype=d) for d in (torch.int32, torch.bfloat16, torch.float32))
        return (
            self.kernel_args(i32, bf16, f32, bf16)
            | {"peer_slots": torch.empty(1, dtype=torch.int64)}
            | {
                "peer_flags": torch.empty(1, dtype=torch.int64),
                "arrive": i32,
            }
        )
