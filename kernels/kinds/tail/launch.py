"""The `tail` launch of one build key: its table and buffers laid out once; each call is one launch."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from glm53ctl.kernels.kinds.base import KnobRecord
from glm53ctl.kernels.kinds.tail.kernel import tail_kernel
from glm53ctl.kernels.kinds.tail.table import GATHER_N, build_table
from glm53ctl.kernels.ops.gemv.kernel import fold_norm, folds
from glm53ctl.kernels.ops.tail.tasks import TAIL_LM_HEAD
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime
from glm53ctl.kernels.runtime.ranks import PeerLinks


class TailPeers(NamedTuple):
    """The peers' logits [T, R, V_LOCAL] (emulated: a buffer; real ranks: this rank's mailbox), and where a real
    rank pushes its own: the peers' mailboxes and flag words, and its programs' arrival word."""

    logits: Any
    slots: Any
    flags: Any
    arrive: Any


class TailDims(NamedTuple):
    """The tail kernel's compile-time shapes and tiles."""

    D: int
    HC: int
    V_LOCAL: int  # this rank's vocabulary share
    V: int  # the logits' width: V_LOCAL, or a full launch's whole vocabulary
    BLOCK_N: int
    BLOCK_K: int
    GATHER_COLS: int
    M: int
    TP: int


class TailLaunch(PersistentLaunch):
    """One build key of `tail`: the table and buffers are laid out once; each call is one launch.

    tp > 1 runs rank 0's shard and gathers the peers' logits from `peer_logits` [tp-1, R, V/tp]. With `links`,
    one rank of real ranks: its LM_HEAD tasks push their tiles into every peer's mailbox, and its GATHER tasks
    copy the peers' from its own (kernels/runtime/ranks.py); every rank ends with the full logits."""

    kernel = tail_kernel

    def __init__(
        self, spec, tp: int, rows: int, knobs: KnobRecord, device, partial_only: bool = False,
        links: PeerLinks | None = None,
    ) -> None:  # fmt: skip
        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.D, self.v_local = spec.hidden, spec.shards(tp).vocab
        self.partial_only = partial_only
        self.links = links
        self.table = self.layout(spec, tp, rows, knobs, partial_only, links.rank if links else None)
        self.grid = knobs.grid
        flags = links.flags.local if links else None
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid, flags=flags)
        self.peer_words = self.table.n_tasks  # where the peers' words start in every rank's flag mailbox
        self.arrive = torch.zeros(1, dtype=torch.int32, device=device)
        self.n_pushers = sum(t[0] == TAIL_LM_HEAD for t in self.table.tasks)  # real ranks: the tasks that push
        self._no_peers = torch.zeros(1, dtype=torch.int64, device=device)
        self.h_hat = torch.zeros(16, self.D, dtype=torch.bfloat16, device=device)
        self.rstd = torch.zeros(16, dtype=torch.float32, device=device)
        assert rows * spec.mhc.streams <= 32, "the folded GEMV pads H's stream rows to at most 32"

    @staticmethod
    def layout(spec, tp: int, rows: int, knobs: KnobRecord, partial_only: bool = False, rank: int | None = None):
        """The task table; with real ranks (`rank` given) the GATHER tasks last whatever `gathers` says (a gather
        waits on a peer's whole shard, so one before this rank's own GEMV tasks would wait on a peer waiting on
        it), and the peers named by their ranks."""
        table = build_table(
            rows,
            spec.shards(tp).vocab,
            1 if partial_only else tp,
            knobs.block_n,
            knobs.handoff,
            "last" if rank is not None else knobs.gathers,
            knobs.split,
            knobs.grid,
            folds(knobs.norm, rows, spec.mhc.streams),
        )
        if rank is not None:
            table.peer_ranks = [q for q in range(tp) if q != rank]
        return table

    @staticmethod
    def mailbox_shapes(spec, tp: int, rows: int, knobs: KnobRecord) -> dict[str, tuple[int, ...]]:
        """The mailboxes real ranks make before their launches (PeerLinks)."""
        n_tasks = TailLaunch.layout(spec, tp, rows, knobs, rank=0).n_tasks
        return {"slots": (2, tp, rows, spec.shards(tp).vocab), "flags": (n_tasks + tp - 1,)}

    def prepare_lm_head(self, norm_w: torch.Tensor, lm_w: torch.Tensor) -> torch.Tensor:
        """The lm_head shard as this launch reads it: folded with the norm weight under `norm` "fold"."""
        return fold_norm(norm_w, lm_w) if folds(self.knobs.norm, self.rows, self.spec.mhc.streams) else lm_w

    @property
    def width(self) -> int:
        """Logits columns this launch writes: the full row, or a rank's slice for a partial launch."""
        return self.v_local * (1 if self.partial_only else self.tp)

    def kernel_args(
        self, H, norm_w, lm_w, logits, peer_logits, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS, mute=False
    ) -> dict:
        links = self.links
        args = self.runtime_args(stuck_site, budget_ns) | {
            "H": H,
            "norm_w": norm_w,
            "h_hat": self.h_hat,
            "rstd": self.rstd,
            "lm_w": lm_w,
            "logits": logits,
            "peers": TailPeers(
                links.slots.local if links else peer_logits,
                links.slots.bases if links else self._no_peers,
                links.flags.bases if links else self._no_peers,
                self.arrive,
            ),
            "R": self.rows,
            "eps": self.spec.model.rms_norm_eps,
            "rank": links.rank if links else 0,
            "mute": int(mute),
            "n_pushers": self.n_pushers,
            "peer_words": self.peer_words,
        }
        if links:
            args["n_peers"] = 0  # the peers write their own words: the last program leaves them alone
        return args

    def constexprs(self) -> dict:
        return self.runtime_constexprs() | {
            "dims": TailDims(
                D=self.D,
                HC=self.spec.mhc.streams,
                V_LOCAL=self.v_local,
                V=self.width,
                BLOCK_N=self.knobs.block_n,
                BLOCK_K=min(self.knobs.block_k, self.D),
                GATHER_COLS=GATHER_N,
                # the folded GEMV's rows are H's R * HC stream rows, padded to a `tl.dot` tile
                M=16 if self.rows * self.spec.mhc.streams <= 16 else 32,
                TP=self.tp,
            ),
            "NORM_FOLD": folds(self.knobs.norm, self.rows, self.spec.mhc.streams),
            "REMOTE": self.links is not None,
        }

    def __call__(
        self, H, norm_w, lm_w, peer_logits=None, out=None, stuck_site=-1, budget_ns=None, check=True, mute=False
    ):
        R, D = self.rows, self.D
        assert H.shape == (R, self.spec.mhc.streams, D) and H.dtype == torch.bfloat16 and H.is_contiguous()
        assert lm_w.shape == (self.v_local, D) and lm_w.is_contiguous()
        if self.links is not None:
            peer_logits = H  # the peers' logits come through the mailbox
        elif self.tp > 1 and not self.partial_only:
            assert peer_logits is not None and peer_logits.shape == (self.tp - 1, R, self.v_local)
        else:
            peer_logits = H  # never read
        logits = out if out is not None else torch.empty(R, self.width, dtype=torch.float32, device=H.device)
        args = self.kernel_args(H, norm_w, lm_w, logits, peer_logits, stuck_site, budget_ns or DEFAULT_BUDGET_NS, mute)
        self.launch(args, check)
        return logits

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        bf16, f32 = (torch.empty(1, dtype=d) for d in (torch.bfloat16, torch.float32))
        peers = f32 if self.tp > 1 and not self.partial_only else bf16  # __call__ passes H when no peers
        return self.kernel_args(bf16, bf16, bf16, f32, peers)
