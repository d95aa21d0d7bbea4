"""The layer launch of one build key and rank (`dense`, `kda`, `sparse`: one kernel, two halves): its table and
buffers laid out once, each half's only; each call is one launch of the layer kernel with its arguments grouped by
concern (args.py)."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds.base import KnobRecord
from glm53ctl.kernels.kinds.layer.args import (
    OUTPUT_NAMES,
    Consts,
    GateWeights,
    Handoffs,
    KdaBuffers,
    KdaStates,
    KdaWeights,
    LayerDims,
    MlaBuffers,
    MlaCaches,
    MlaDims,
    MlaWeights,
    MlpBuffers,
    MlpWeights,
    MoeBuffers,
    MoeDims,
    MoeWeights,
    Outputs,
    Peers,
    Schedule,
    pick,
)
from glm53ctl.kernels.kinds.layer.kernel import layer_kernel
from glm53ctl.kernels.kinds.layer.table import Dims, build_table, kda_parts, mix_tasks
from glm53ctl.kernels.ops.dsa.naive import mla_scale
from glm53ctl.kernels.ops.ffn.moe import ROUTER_TILE, n_slots_for
from glm53ctl.kernels.ops.gemv.kernel import folds
from glm53ctl.kernels.ops.gemv.layer import PR
from glm53ctl.kernels.ops.kda.kernel import SCRATCH
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime
from glm53ctl.kernels.runtime.ranks import PeerLinks
from glm53ctl.kernels.runtime.stages import stage_launch
from glm53ctl.kernels.runtime.tasks import types_mask
from glm53ctl.kernels.state import DsaCache


class LayerLaunch(PersistentLaunch):
    """One build key of a layer kind for one rank: table and buffers laid out once; each call is one launch.

    attn "kda" | "mla" and ffn "dense" | "moe": the halves (the registry's `layer` of the kind). mode "full" (rank
    0 of a TP launch, or TP1): every output; the peers' partials are read from `parts_a` / `parts_f` [T, R, D]
    (set_peers). Modes "attn" and "ffn" are the peers' partial launches. A call takes H [R, hc, D] bf16, the
    weights (weights.py), and the attention half's state: KDA's conv and recurrent states (read; written to
    conv_out, S_out), or MLA's caches (replicated; written at pos only; room for `slots` tokens a row, whole
    pools) and pos [R] int32 (tokens cached before the step)."""

    kernel = layer_kernel
    code_types = ()  # a stage launch's task types (`stage`): with knob stage_code=own, its kernel is built for these

    def __init__(
        self,
        spec,
        tp: int,
        rows: int,
        knobs: KnobRecord,
        device,
        rank: int = 0,
        mode: str = "full",
        ffn: str = "dense",
        attn: str = "kda",
        slots: int = 4,
        links: PeerLinks | None = None,
    ) -> None:
        self.spec, self.tp, self.rows, self.knobs, self.rank, self.mode = spec, tp, rows, knobs, rank, mode
        self.device = torch.device(device)
        self.d = d = Dims(spec, tp, knobs, ffn, attn, slots)
        # `links` (real ranks, kernels/runtime/ranks.py): this rank pushes its partials into its peers' mailboxes
        # and reduces from its own; its flag words are its mailbox's
        self.links = links
        assert links is None or (links.rank == rank and mode == "full")
        self.table = build_table(d, rows, knobs, mode, rank if links else None)
        self.grid = knobs.grid
        self.tracing = False  # a diagnostic build: each task's claim, ready and publish times (runtime/trace.py)
        # the KDA heads' arrival words (`arrive_last`), then the routing's, then (real ranks) the two
        # all-reduces' pushes: tagged with the epoch of the launch's own runtime, so never shared with another
        # launch (a stage of separate launches has its own)
        self.arrive = torch.zeros(rows * d.HL + 1 + 2, dtype=torch.int32, device=self.device)
        flags = links.flags.local if links else None
        self.runtime = Runtime(self.table, self.device, max_programs=self.grid, flags=flags)
        # where the peers' words start in every rank's flag mailbox (a stage's pushes tag them there too)
        self.peer_words = self.table.n_tasks
        self._no_peers = torch.zeros(1, dtype=torch.int64, device=self.device)
        e = self._zeros
        R, D, HC = rows, d.D, d.HC
        self.buf = {
            "mixp": e(2, d.NCH, 16, 32),
            "ssp": e(2, d.NCH, 16),
            "gram": e(2, d.NCH, 16, HC * HC),
            "kpart_a": e(d.KS_O, R, D),
            "parts_a": e(tp, R, D),
            "kpart_f": e(d.KS_F, R, D),
            "parts_f": e(tp, R, D),
            "pr": e(2, 16, PR.value),  # the attention and FFN gates' pre and 1/RMS per row
            "trace": e(self.table.n_tasks, 5, dtype=torch.int64),  # written only by a traced launch
        }
        self.buf |= self._mla_buffers() if d.mla else self._kda_buffers()
        self.nslot = n_slots_for(rows, d.TOPK) if d.moe else 1
        self.buf |= self._moe_buffers() if d.moe else self._mlp_buffers()
        self.out = {
            "attn.x_hat": e(R, D, dtype=torch.bfloat16),
            "attn.post": e(R, HC),
            "attn.comb": e(R, HC, HC),
            "attn.out": e(R, D),
            "attn.H": e(R, HC, D, dtype=torch.bfloat16),
            "ffn.x_hat": e(R, D, dtype=torch.bfloat16),
            "ffn.post": e(R, HC),
            "ffn.comb": e(R, HC, HC),
            "ffn.out": e(R, D),
            "H": e(R, HC, D, dtype=torch.bfloat16),
        }
        if d.moe:
            self.out |= {"moe.ids": self.buf["ids"], "moe.weights": self.buf["wts"]}
        if d.mla:
            self.out["dsa.idx"] = self.buf["idx"]
        else:  # the KDA states' writes
            st = spec.shards(tp).state_shapes(rows, 1)
            self.conv_out = e(*st["kda.conv"], dtype=torch.bfloat16)
            self.S_out = e(*st["kda.recurrent"])

    def _zeros(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _kda_buffers(self) -> dict[str, torch.Tensor]:
        d, R, e = self.d, self.rows, self._zeros
        return {
            "y_in": e(R, d.NIN),
            "lr": e(R, 2 * d.RG, dtype=torch.bfloat16),
            "z": e(R, d.P, dtype=torch.bfloat16),
            "kscr": e(R, SCRATCH, d.P),
            "ipp": e(d.KS_IN, 32, d.NIN),  # the in-projection's K-slice sums
        }

    def _mla_buffers(self) -> dict[str, torch.Tensor]:
        d, R, e = self.d, self.rows, self._zeros
        bf16 = torch.bfloat16
        return {
            "y_a": e(R, d.NA),
            "qr": e(R, d.QL, dtype=bf16),
            "wi": e(R, d.HI),
            "q_mla": e(R, d.HQ * d.NOPE, dtype=bf16),
            "qi": e(R, d.HI * d.IH),
            "q_lat": e(R, d.HQ, d.C, dtype=bf16),
            "scores": e(R, d.LMAX // d.KP),
            "sel_hist": e(R, 4, d.SEL.NQ, 256, dtype=torch.int32),
            "sel_state": e(R, 4, 2, dtype=torch.int32),
            "sel_above": e(R, 4, d.SEL.NQ, dtype=torch.int32),
            "idx": e(R, d.WIDTH, dtype=torch.int32),
            "part_o": e(R, d.NB, d.HQ, d.C),
            "part_m": e(R, d.NB, d.HQ),
            "part_l": e(R, d.NB, d.HQ),
            "o_lat": e(R, d.HQ, d.C, dtype=bf16),
            "o_mla": e(R, d.HQ * d.V, dtype=bf16),
        }

    def _mlp_buffers(self) -> dict[str, torch.Tensor]:
        d, e = self.d, self._zeros
        return {
            "act": e(self.rows, d.I, dtype=torch.bfloat16),
            "gup": e(d.KS_GU, 2, 32, d.I),  # gate/up's K-slice sums (slice 0 adds them)
        }

    def _moe_buffers(self) -> dict[str, torch.Tensor]:
        d, R, n, e = self.d, self.rows, self.nslot, self._zeros
        i32 = torch.int32
        return {
            "logits": e(d.KS_RT, 16, d.E),  # the router's K-slice sums
            "ids": e(R, d.TOPK, dtype=i32),
            "wts": e(R, d.TOPK),
            "route_on": e(16, d.E, dtype=i32),  # which experts each row chose
            "slots": e(n, dtype=i32),
            "n_slots": e(1, dtype=i32),
            "slot_of": e(d.E, dtype=i32),
            "gup_m": e(n + 1, d.KS_GU, 2, 16, d.I),  # the slots' gate/up K-slice sums (slice 0 adds them)
            "act_m": e(n + 1, 16, d.I, dtype=torch.bfloat16),
            "y_m": e(n + 1, 16, d.D),
        }

    def stage(self, ttypes, one_task: bool = False) -> LayerLaunch:
        """This launch as one stage launch (runtime/stages.py): the same buffers, and arrival words of its own
        (they are tagged with its own runtime's epochs) and trace records of its own (its tasks' ids are its
        table's)."""
        s = stage_launch(self, ttypes, one_task)
        if one_task:  # the stage schedule's (launch=stages), not the separate-launch baselines'
            s.code_types = tuple(int(getattr(t, "value", t)) for t in ttypes)
        s.arrive = torch.zeros_like(self.arrive)
        s.buf = self.buf | {"trace": self._zeros(s.table.n_tasks, 5, dtype=torch.int64)}
        return s

    def trace_record(self):
        """A traced launch's table and records (runtime/trace.py)."""
        return self.table, self.buf["trace"]

    def set_peers(self, parts_a: torch.Tensor | None = None, parts_f: torch.Tensor | None = None) -> None:
        """The other ranks' partials [T, R, D] (this rank's slot is ignored): what the all-reduces read."""
        if parts_a is not None:
            self.buf["parts_a"].copy_(parts_a)
        if parts_f is not None:
            self.buf["parts_f"].copy_(parts_f)

    def poison(self) -> None:
        """NaN in every output and write, so an element the launch leaves alone fails every check; and in every
        hand-off buffer a task fills for another (not the peers' partials, set before), so a task that reads
        one before its producer wrote it, or a launch that leaves one as an earlier launch wrote it (a fault's
        retry with the same inputs, say), reads NaN instead of values that happen to be right."""
        writes = [] if self.d.mla else [self.conv_out, self.S_out]
        for t in [*self.out.values(), *writes]:
            t.fill_(float("nan") if t.is_floating_point() else -1)
        for name, t in self.buf.items():
            if t.is_floating_point() and name not in ("parts_a", "parts_f"):
                t.fill_(float("nan"))
        if self.d.mla:
            self.buf["idx"].fill_(-2)  # never a token, never the padding

    def attn_state(self, *state) -> KdaStates | MlaCaches:
        """The attention half's state argument: KDA's (conv_in, S_in), or MLA's (caches, pos)."""
        if self.d.mla:
            cache, pos = state
            return MlaCaches(cache.latent, cache.index_key, cache.index_gate, cache.pooled_key, pos)
        conv_in, S_in = state
        return KdaStates(conv_in, S_in, self.conv_out, self.S_out)

    @staticmethod
    def mailbox_shapes(spec, tp: int, rows: int, knobs: KnobRecord, **dims) -> dict[str, tuple[int, ...]]:
        """The mailboxes real ranks make before their launches (PeerLinks): every rank's partials of both
        all-reduces [2 (launch parity), 2 (attention, FFN), T, R, D], and the table's flag words then two groups of
        one word per peer. `dims`: the layer's halves and caches (ffn, attn, slots), as the launch takes them."""
        d = Dims(spec, tp, knobs, **dims)
        n_tasks = build_table(d, rows, knobs, "full", 0).n_tasks
        return {"slots": (2, 2, tp, rows, spec.hidden), "flags": (n_tasks + 2 * (tp - 1),)}

    def kernel_args(self, H, w, state, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS, mute=False) -> dict:
        d, b, spec, links = self.d, self.buf, self.spec, self.links
        n_push = self.rows * d.NCH  # real ranks: the OWN tasks of one all-reduce, which push
        peers = Peers(
            links.slots.local if links else b["parts_a"],
            links.slots.bases if links else self._no_peers,
            links.flags.bases if links else self._no_peers,
            self.arrive[self.rows * d.HL + 1 :],
            self.peer_words,
        )
        args = self.runtime_args(stuck_site, budget_ns) | {"peers": peers, "mute": int(mute), "n_pushers": n_push}
        if links:
            args["n_peers"] = 0  # the peers write their own words: the last program leaves them alone
        return args | {
            "H": H,
            "gates": pick(GateWeights, w),
            "attn_w": pick(MlaWeights if d.mla else KdaWeights, w),
            "attn_state": state,
            "attn_buf": pick(MlaBuffers if d.mla else KdaBuffers, b),
            "ffn_w": pick(MoeWeights if d.moe else MlpWeights, w),
            "ffn_buf": pick(MoeBuffers if d.moe else MlpBuffers, b),
            "hand": pick(Handoffs, b | {"arrive": self.arrive}),
            "outs": Outputs(*(self.out[n] for n in OUTPUT_NAMES)),
            "consts": Consts(
                spec.mhc.eps, spec.model.rms_norm_eps, spec.kda.gate_lower_bound, spec.indexer.norm_eps, mla_scale(spec)
            ),
            "R": self.rows,
            "RANK": self.rank,
        }

    def constexprs(self) -> dict:
        d = self.d
        rt = self.runtime_constexprs()
        # the stage schedule's bodies issue their weights first always (knob weights_first: the claim loop's)
        first = bool(self.knobs.get("weights_first", 0)) or self.one_task
        return rt | {
            "dims": self.dims(),
            "mla": self.mla_dims() if d.mla else None,
            "moe": self.moe_dims() if d.moe else None,
            "sched": Schedule(
                # the state write-back after the next task: KDA's only
                OPROJ_FIRST=bool(self.knobs.oproj_first) and not d.mla,
                PREFETCH=self.knobs.prefetch,
                WEIGHTS_FIRST=first,
                PDL_FIRST=first and rt["PDL"],
                FOLD=self.fold,
                MIX_TASK=mix_tasks(self.knobs, self.rows, d.HC),
                TRACE=self.tracing,
                ONLY=types_mask(self.code_types) if self.knobs.stage_code == "own" and self.code_types else 0,
                KNOB=self.knobs.code(),
            ),
            "MLA": d.mla,
            "MOE": d.moe,
            "REMOTE": self.links is not None,
        }

    def dims(self) -> LayerDims:
        d = self.d
        shared = {n: getattr(d, n) for n in LayerDims._fields if hasattr(d, n)}
        return LayerDims(
            **shared,
            ITERS=d.iters,
            LIMIT=self.spec.moe.swiglu_limit,
            # a folded GEMV's rows are H's R * HC stream rows, padded to a `tl.dot` tile
            M=16 if not self.fold or self.rows * d.HC <= 16 else 32,
            NV=kda_parts(self.knobs.kda_split, d.HL, self.rows, self.knobs.grid),
        )

    def moe_dims(self) -> MoeDims:
        d = self.d
        return MoeDims(
            E=d.E,
            E_ALL=1 << (d.E - 1).bit_length(),
            TOPK=d.TOPK,
            SCALE=d.SCALE,
            NSLOT=self.nslot,
            BLOCK_E=ROUTER_TILE,
            KS_RT=d.KS_RT,
            BK_RT=d.BK_RT,
            BN_DN=d.BN_DN,
            EACH=self.knobs.route == "each",
        )

    def mla_dims(self) -> MlaDims:
        d = self.d
        shared = {n: getattr(d, n) for n in MlaDims._fields if hasattr(d, n)}
        return MlaDims(
            **shared,
            QLP=1 << (d.QL - 1).bit_length(),
            HBI=max(16, 1 << (d.HI - 1).bit_length()),
            BK_NOPE=min(self.knobs.block_k, d.NOPE),
        )

    @property
    def fold(self) -> bool:
        """Whether the GEMVs after the gates fold the norm (knob `norm`; never MLA's A projection)."""
        return folds(self.knobs.norm, self.rows, self.d.HC) and not self.d.mla

    def options(self) -> dict:
        opts = super().options()
        if self.knobs.maxnreg:  # a cap for ptxas: fewer registers, more programs resident per SM
            opts["maxnreg"] = self.knobs.maxnreg
        return opts

    def __call__(self, H, w, *state, stuck_site=-1, budget_ns=None, check=True, mute=False) -> dict[str, torch.Tensor]:
        """One launch; `mute` (real ranks, fault injection): this rank never tags its pushes."""
        R, d = self.rows, self.d
        assert H.shape == (R, d.HC, d.D) and H.dtype == torch.bfloat16 and H.is_contiguous()
        s = self.attn_state(*state)
        if d.mla:
            assert s.latent.shape == (R, d.LMAX, d.C) and s.latent.dtype == torch.bfloat16
            assert s.pos.shape == (R,) and s.pos.dtype == torch.int32
            if check:  # reads pos back: not while a CUDA graph captures (check=False there)
                assert int(s.pos.max()) < d.LMAX, f"a row's position is past the caches' {d.LMAX} slots"
        else:
            for t_in, t_out, dtype in ((s.conv_in, s.conv_out, torch.bfloat16), (s.S_in, s.S_out, torch.float32)):
                assert t_in.shape == t_out.shape and t_in.dtype == dtype and t_in.is_contiguous()
                # double-buffered: a KDA head's part 0 shifts the conv state while its other parts may still read it
                assert t_in.data_ptr() != t_out.data_ptr()
        self.launch(self.kernel_args(H, w, s, stuck_site, budget_ns or DEFAULT_BUDGET_NS, mute), check)
        return self.out

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        bf16, f32, i32 = (torch.empty(1, dtype=t) for t in (torch.bfloat16, torch.float32, torch.int32))
        d = self.d
        groups = (GateWeights, MlaWeights if d.mla else KdaWeights, MoeWeights if d.moe else MlpWeights)
        half = ("norm_a", "norm_f", "o_norm", "q_norm", "kv_norm", "k_w", "k_b")
        w = {k: (bf16 if k.startswith("w_") or k in half else f32) for g in groups for k in g._fields}
        state = (DsaCache(bf16, bf16, bf16, bf16), i32) if d.mla else (bf16, f32)
        return self.kernel_args(bf16, w, self.attn_state(*state))
