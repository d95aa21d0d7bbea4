"""The `dense` launch of one build key and rank: its table and buffers laid out once, its weights in the
layout the kernel reads; each call is one launch."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds.dense.kernel import dense_kernel
from glm53ctl.kernels.kinds.dense.table import Dims, build_table, kda_parts, mix_tasks
from glm53ctl.kernels.kinds.dense.tasks import PR
from glm53ctl.kernels.ops.dsa.naive import mla_scale
from glm53ctl.kernels.ops.ffn.moe import ROUTER_TILE, n_slots_for, stack_experts
from glm53ctl.kernels.ops.gemv.kernel import fold_norm, folds
from glm53ctl.kernels.ops.kda.kernel import SCRATCH
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime
from glm53ctl.kernels.runtime.stages import stage_launch


def prepare_weights(
    w, spec, tp: int, device, fold: bool = False, ffn: str = "dense", attn: str = "kda"
) -> dict[str, torch.Tensor]:
    """One rank's layer weights as the kernel reads them (done once per key, like a checkpoint's fused
    layout): the in-projection rows f_a | g_a | b | (q_h | k_h | v_h per head), the conv taps [3P, W] fp32.
    fold (`gemv.folds` of knob `norm` and the rows): the in-projection, gate and up times their gate's norm
    weight, rounded to bf16 once. ffn "moe": the router and the experts stacked by id, the shared expert after
    them (expert E), instead of the dense MLP (gate and up not folded: the router and every expert read x̂).
    attn "mla": `sparse`'s attention half instead of KDA's (`_mla_weights`)."""
    a_ = "self_attn."
    from glm53ctl.tuning.knobs import defaults

    out = {
        "fn_a": w["hc_attn_fn"].float(),
        "base_a": w["hc_attn_base"].float(),
        "scale_a": w["hc_attn_scale"].float(),
        "norm_a": w["input_layernorm.weight"],
        "fn_f": w["hc_ffn_fn"].float(),
        "base_f": w["hc_ffn_base"].float(),
        "scale_f": w["hc_ffn_scale"].float(),
        "norm_f": w["post_attention_layernorm.weight"],
    }
    if attn == "mla":
        out |= _mla_weights(w.sub(a_), spec, tp)
    else:
        d = Dims(spec, tp, defaults("dense"))  # the layout depends on no knob
        qkv = torch.stack([w[f"{a_}{n}_proj.weight"].view(d.HL, d.K, d.D) for n in ("q", "k", "v")], dim=1)
        w_in = torch.cat([w[f"{a_}{n}.weight"] for n in ("f_a_proj", "g_a_proj", "b_proj")] + [qkv.reshape(-1, d.D)])
        out |= _kda_weights(w, a_, w_in, fold)
    out |= _ffn_weights(w, spec, ffn, fold)
    return {k: v.to(device).contiguous() for k, v in out.items()}


def _kda_weights(w, a_: str, w_in, fold: bool) -> dict[str, torch.Tensor]:
    """KDA's attention weights as the kernel reads them."""
    return {
        "w_in": fold_norm(w["input_layernorm.weight"], w_in) if fold else w_in.to(torch.bfloat16),
        "w_fb": w[f"{a_}f_b_proj.weight"],
        "w_gb": w[f"{a_}g_b_proj.weight"],
        "conv_w": torch.cat([w[f"{a_}{n}_conv1d.weight"][:, 0] for n in ("q", "k", "v")]).float(),
        "A_log": w[f"{a_}A_log"].float(),
        "dt_bias": w[f"{a_}dt_bias"].float(),
        "o_norm": w[f"{a_}o_norm.weight"],
        "w_o": w[f"{a_}o_proj.weight"],
    }


def _mla_weights(a, spec, tp: int) -> dict[str, torch.Tensor]:
    """`sparse`'s attention weights as the kernel reads them: the fused A projection (q_a | kv_a | the indexer's
    wk | its pool gate | its head weights), q_b | the indexer's wq_b, and per head W_UKᵀ [HQ, C, NOPE] and W_UV
    [HQ, V, C] from kv_b."""
    from glm53ctl.kernels.ops.dsa.kernel import a_weight

    m = spec.mla
    kv_b = a["kv_b_proj.weight"].view(spec.shards(tp).mla_heads, m.qk_nope_head_dim + m.v_head_dim, m.kv_lora_rank)
    bf = torch.bfloat16
    return {
        "w_a": a_weight(a),
        "q_norm": a["q_a_layernorm.weight"].to(bf),
        "kv_norm": a["kv_a_layernorm.weight"].to(bf),
        "k_w": a["indexer.k_norm.weight"].to(bf),
        "k_b": a["indexer.k_norm.bias"].to(bf),
        "ape": a["indexer.index_kpool_compress_ape"].float(),
        "w_qb": torch.cat([a["q_b_proj.weight"], a["indexer.wq_b.weight"]]).to(bf),
        "w_ukt": kv_b[:, : m.qk_nope_head_dim].transpose(1, 2).to(bf),
        "w_uv": kv_b[:, m.qk_nope_head_dim :].to(bf),
        "w_o": a["o_proj.weight"].to(bf),
    }


def _ffn_weights(w, spec, ffn: str, fold: bool) -> dict[str, torch.Tensor]:
    norm_f = w["post_attention_layernorm.weight"]
    out = {}
    if ffn == "moe":
        m = w.sub("mlp.")
        w_eg, w_eu, w_ed = stack_experts(m, spec.moe.experts, shared=True)
        out |= {"w_r": m["gate.weight"].to(torch.bfloat16), "r_bias": m["gate.e_score_correction_bias"].float()}
        out |= {"w_eg": w_eg, "w_eu": w_eu, "w_ed": w_ed}
    else:
        out["w_gate"] = fold_norm(norm_f, w["mlp.gate_proj.weight"]) if fold else w["mlp.gate_proj.weight"]
        out["w_up"] = fold_norm(norm_f, w["mlp.up_proj.weight"]) if fold else w["mlp.up_proj.weight"]
        out["w_down"] = w["mlp.down_proj.weight"]
    return out


class DenseLaunch(PersistentLaunch):
    """One build key of `dense` for one rank: table and buffers laid out once; each call is one launch.

    mode "full" (rank 0 of a TP launch, or TP1): every output; the peers' partials are read from
    `parts_a` / `parts_f` [T, R, D] (set_peers). Modes "attn" and "ffn" are the peers' partial launches."""

    kernel = dense_kernel

    def __init__(
        self,
        spec,
        tp: int,
        rows: int,
        knobs: dict,
        device,
        rank: int = 0,
        mode: str = "full",
        ffn: str = "dense",
        attn: str = "kda",
        slots: int = 4,
    ) -> None:
        self.spec, self.tp, self.rows, self.knobs, self.rank, self.mode = spec, tp, rows, knobs, rank, mode
        self.device = torch.device(device)
        self.d = d = Dims(spec, tp, knobs, ffn, attn, slots)
        self.table = build_table(d, rows, knobs, mode)
        self.grid = knobs["grid"]
        self.tracing = False  # a diagnostic build: each task's claim, ready and publish times (runtime/trace.py)
        # the KDA heads' arrival words (`arrive_last`), then the routing's: tagged with the epoch of the launch's
        # own runtime, so never shared with another launch (a stage of separate launches has its own)
        self.arrive = torch.zeros(rows * d.HL + 1, dtype=torch.int32, device=self.device)
        self.runtime = Runtime(self.table, self.device, max_programs=self.grid)
        f32, bf16 = torch.float32, torch.bfloat16
        e = lambda *shape, dtype=f32: torch.zeros(shape, dtype=dtype, device=self.device)
        R, D, HC = rows, d.D, d.HC
        self.buf = {
            "mixp": e(2, d.NCH, 16, 32),
            "ssp": e(2, d.NCH, 16),
            "y_in": e(R, d.NIN),
            "lr": e(R, 2 * d.RG, dtype=bf16),
            "z": e(R, d.P, dtype=bf16),
            "kscr": e(R, SCRATCH, d.P),
            "kpart_a": e(d.KS_O, R, D),
            "parts_a": e(tp, R, D),
            "act": e(R, d.I, dtype=bf16),
            "kpart_f": e(d.KS_F, R, D),
            "parts_f": e(tp, R, D),
            "pr": e(2, 16, PR.value),  # the attention and FFN gates' pre and 1/RMS per row
            "gup": e(d.KS_GU, 2, 32, d.I),  # gate/up's K-slice sums (slice 0 adds them)
            "ipp": e(d.KS_IN, 32, d.NIN),  # the in-projection's K-slice sums
            "trace": e(self.table.n_tasks, 5, dtype=torch.int64),  # written only by a traced launch
        }
        # the MoE's routing and slots (kda; one-element stand-ins in a dense launch, which never reads them)
        i32 = torch.int32
        self.nslot = n = n_slots_for(rows, d.TOPK) if d.moe else 1
        moe = lambda *shape, dtype=f32: e(*shape, dtype=dtype) if d.moe else e(1, dtype=dtype)  # noqa: E731
        self.buf |= {
            "logits": moe(d.KS_RT, 16, d.E),  # the router's K-slice sums
            "ids": moe(R, d.TOPK, dtype=i32),
            "wts": moe(R, d.TOPK),
            "route_on": moe(16, d.E, dtype=i32),  # which experts each row chose
            "slots": moe(n, dtype=i32),
            "n_slots": moe(1, dtype=i32),
            "slot_of": moe(d.E, dtype=i32),
            "gup_m": moe(n + 1, d.KS_GU, 2, 16, d.I),  # the slots' gate/up K-slice sums (slice 0 adds them)
            "act_m": moe(n + 1, 16, d.I, dtype=bf16),
            "y_m": moe(n + 1, 16, D),
        }
        self.out = {
            "attn.x_hat": e(R, D, dtype=bf16),
            "attn.post": e(R, HC),
            "attn.comb": e(R, HC, HC),
            "attn.out": e(R, D),
            "attn.H": e(R, HC, D, dtype=bf16),
            "ffn.x_hat": e(R, D, dtype=bf16),
            "ffn.post": e(R, HC),
            "ffn.comb": e(R, HC, HC),
            "ffn.out": e(R, D),
            "H": e(R, HC, D, dtype=bf16),
        }
        if d.moe:
            self.out |= {"moe.ids": self.buf["ids"], "moe.weights": self.buf["wts"]}
        # the weights of the other FFN: stand-ins the kernel never reads
        self.stubs = {n: e(1, dtype=bf16) for n in (MOE_WEIGHTS if not d.moe else DENSE_FFN_WEIGHTS)}
        self.stubs |= {"r_bias": e(1)} if not d.moe else {}
        # the other attention half's weights and buffers (a KDA layer's launch: MLA's; sparse's: KDA's)
        if d.mla:  # with their dtypes: the KDA tasks are compiled (never run) in an MLA build too
            self.stubs |= {n: e(1, dtype=f32 if n in ("conv_w", "A_log", "dt_bias") else bf16) for n in KDA_WEIGHTS}
        else:
            self.stubs |= {n: e(1, dtype=t) for n, t in MLA_STUBS.items()}
        st = spec.shards(tp).state_shapes(rows, 1)
        self.conv_out = e(*st["kda.conv"], dtype=bf16)
        self.S_out = e(*st["kda.recurrent"])

    def stage(self, ttypes) -> DenseLaunch:
        """This launch as one stage of the separate-launches baseline (runtime/stages.py): the same buffers, and
        arrival words of its own (they are tagged with its own runtime's epochs)."""
        s = stage_launch(self, ttypes)
        s.arrive = torch.zeros_like(self.arrive)
        return s

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
        for t in [*self.out.values(), self.conv_out, self.S_out]:
            t.fill_(float("nan") if t.is_floating_point() else -1)
        for name, t in self.buf.items():
            if t.is_floating_point() and name not in ("parts_a", "parts_f"):
                t.fill_(float("nan"))

    def kernel_args(self, H, w, conv_in, S_in, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS) -> dict:
        o = self.out
        return (
            self.runtime_args(stuck_site, budget_ns)
            | {
                "H": H,
                **self.stubs,
                **w,
                "conv_in": conv_in,
                "S_in": S_in,
                "conv_out": self.conv_out,
                "S_out": self.S_out,
            }
            | self.buf
            | {
                "arrive": self.arrive,
                "x_hat_a": o["attn.x_hat"],
                "post_a": o["attn.post"],
                "comb_a": o["attn.comb"],
                "attn": o["attn.out"],
                "H1": o["attn.H"],
                "x_hat_f": o["ffn.x_hat"],
                "post_f": o["ffn.post"],
                "comb_f": o["ffn.comb"],
                "ffn_out": o["ffn.out"],
                "H2": o["H"],
                "R": self.rows,
                "RANK": self.rank,
                "hc_eps": self.spec.mhc.eps,
                "norm_eps": self.spec.model.rms_norm_eps,
                "lower_bound": self.spec.kda.gate_lower_bound,
                "ln_eps": self.spec.indexer.norm_eps,
                "mla_scale": mla_scale(self.spec),
            }
        )

    def constexprs(self) -> dict:
        d = self.d
        names = ("D", "HC", "HL", "K", "W", "RG", "I", "T", "CH", "NCH", "KS_O", "KS_F", "KS_GU", "KS_IN")
        names += ("BN", "BN_GU", "BN_O")
        return (
            self.runtime_constexprs()
            | {n: getattr(d, n) for n in names}
            | {
                "ITERS": d.iters,
                "BK_D": d.BK_D,
                "BK_R": d.BK_R,
                "BK_O": d.BK_O,
                "BK_I": d.BK_I,
                "BK_GU": d.BK_GU,
                "BK_IN": d.BK_IN,
                "LIMIT": self.spec.moe.swiglu_limit,
                "OPROJ_FIRST": bool(self.knobs["oproj_first"]),
                "PREFETCH": self.knobs["prefetch"],
                "FOLD": self.fold,
                # a folded GEMV's rows are H's R * HC stream rows, padded to a `tl.dot` tile
                "M": 16 if not self.fold or self.rows * d.HC <= 16 else 32,
                "TRACE": self.tracing,
                "NV": kda_parts(self.knobs["kda_split"], d.HL, self.rows, self.knobs["grid"]),
                "MIX_TASK": mix_tasks(self.knobs, self.rows, d.HC),
            }
            | (
                {
                    "MOE": True,
                    "E": d.E,
                    "E_ALL": 1 << (d.E - 1).bit_length(),
                    "TOPK": d.TOPK,
                    "SCALE": d.SCALE,
                    "NSLOT": self.nslot,
                    "BLOCK_E": ROUTER_TILE,
                    "KS_RT": d.KS_RT,
                    "BK_RT": d.BK_RT,
                    "BN_DN": d.BN_DN,
                }
                if d.moe
                else {}
            )
            | (self.mla_constexprs() if d.mla else {})
        )

    @property
    def fold(self) -> bool:
        """Whether the GEMVs after the gates fold the norm (knob `norm`; never MLA's A projection)."""
        return folds(self.knobs["norm"], self.rows, self.d.HC) and not self.d.mla

    def mla_constexprs(self) -> dict:
        d = self.d
        names = ("HQ", "NOPE", "V", "C", "QL", "IH", "HI", "KP", "WIDTH", "TOPP", "LMAX", "NA", "NQB", "BP", "TB")
        names += ("NB", "HB", "BN_AB", "BN_UV", "BK_A", "BK_QB", "BK_C")
        pools = d.LMAX // d.KP
        return {n: getattr(d, n) for n in names} | {
            "MLA": True,
            "QLP": 1 << (d.QL - 1).bit_length(),
            "HBI": max(16, 1 << (d.HI - 1).bit_length()),
            "BK_NOPE": min(self.knobs["block_k"], d.NOPE),
            # blocks of 1024 scores: at 4 warps the selection alone took 57 µs over 8,192 pools against 107 µs in
            # blocks of 4096 (H200, docs/perf/sparse.md)
            "SEL_BLOCK": min(1024, max(16, 1 << (pools - 1).bit_length())),
        }

    def options(self) -> dict:
        opts = super().options()
        if self.knobs["maxnreg"]:  # a cap for ptxas: fewer registers, more programs resident per SM
            opts["maxnreg"] = self.knobs["maxnreg"]
        return opts

    def __call__(self, H, w, conv_in, S_in, stuck_site=-1, budget_ns=None, check=True) -> dict[str, torch.Tensor]:
        R, d = self.rows, self.d
        assert H.shape == (R, d.HC, d.D) and H.dtype == torch.bfloat16 and H.is_contiguous()
        assert conv_in.shape == self.conv_out.shape and conv_in.dtype == torch.bfloat16 and conv_in.is_contiguous()
        assert S_in.shape == self.S_out.shape and S_in.dtype == torch.float32 and S_in.is_contiguous()
        # double-buffered: a KDA head's part 0 shifts the conv state while its other parts may still read it
        assert conv_in.data_ptr() != self.conv_out.data_ptr() and S_in.data_ptr() != self.S_out.data_ptr()
        args = self.kernel_args(H, w, conv_in, S_in, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        self.launch(args, check)
        return self.out

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        bf16, f32 = (torch.empty(1, dtype=t) for t in (torch.bfloat16, torch.float32))
        names = (
            WEIGHTS + (MLA_WEIGHTS if self.d.mla else KDA_WEIGHTS) + (MOE_WEIGHTS if self.d.moe else DENSE_FFN_WEIGHTS)
        )
        half = ("norm_a", "norm_f", "o_norm", "q_norm", "kv_norm", "k_w", "k_b")
        w = {k: (bf16 if k.startswith("w_") or k in half else f32) for k in names}
        return self.kernel_args(bf16, w, bf16, f32)


# what every layer launch reads: the gates' weights and o_proj
WEIGHTS = ("fn_a", "base_a", "scale_a", "norm_a", "fn_f", "base_f", "scale_f", "norm_f", "w_o")
DENSE_FFN_WEIGHTS = ("w_gate", "w_up", "w_down")
MOE_WEIGHTS = ("w_r", "r_bias", "w_eg", "w_eu", "w_ed")
KDA_WEIGHTS = ("w_in", "w_fb", "w_gb", "conv_w", "A_log", "dt_bias", "o_norm")
MLA_WEIGHTS = ("w_a", "q_norm", "kv_norm", "k_w", "k_b", "ape", "w_qb", "w_ukt", "w_uv")
# a KDA layer's stand-ins for what only sparse's attention half reads, with their dtypes
MLA_STUBS = {n: torch.bfloat16 for n in ("latent", "index_key", "index_gate", "pooled", "q_mla", "qr", "q_lat")}
MLA_STUBS |= {n: torch.bfloat16 for n in ("o_lat", "o_mla", *MLA_WEIGHTS)} | {"ape": torch.float32}
MLA_STUBS |= {n: torch.float32 for n in ("y_a", "wi", "qi", "scores", "part_o", "part_m", "part_l")}
MLA_STUBS |= {"pos": torch.int32, "idx": torch.int32}
