"""The PyTorch reference of a whole decode step, one function per launch kind (docs/design.md §2).

Each kind takes the decode state and its inputs and returns every output and every write, so a kernel
can be compared tensor by tensor. TP-T is computed rank by rank on each rank's shards, and the
partial sums are reduced in rank order: it equals TP1 (tests/kernels/test_reference.py).

The state held here is TP-independent: KDA states with all heads (a rank reads its slice), DSA caches
once (replicated on every rank). Values are in the compute dtype, rounded where the kernels store bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from glm53ctl.errors import UsageError
from glm53ctl.kernels.numerics import FP32, Numerics
from glm53ctl.kernels.ops.dsa.naive import dsa_attention, dsa_attention_prefill
from glm53ctl.kernels.ops.embed.naive import check_tokens, embed_partial, streams
from glm53ctl.kernels.ops.ffn.naive import moe, swiglu_mlp
from glm53ctl.kernels.ops.kda.naive import kda_attention, kda_attention_prefill
from glm53ctl.kernels.ops.mhc.naive import gate, hc_post
from glm53ctl.kernels.ops.tail.naive import final_norm, logits_shard
from glm53ctl.kernels.spec import ModelSpec
from glm53ctl.kernels.state import DsaCache, KdaState
from glm53ctl.kernels.weights import ROOT, Weights

Tensors = dict[str, torch.Tensor]


@dataclass
class DecodeState:
    """Everything a step reads and writes besides the weights; rows have their own positions."""

    pos: torch.Tensor  # [R] int64: tokens already cached per row
    max_context: int
    kda: dict[int, KdaState] = field(default_factory=dict)
    dsa: dict[int, DsaCache] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return self.pos.shape[0]

    def tensors(self, layers: list[int] | None = None) -> Tensors:
        """Flat name -> tensor, as saved and compared."""
        out = {}
        for i, s in self.kda.items():
            if layers is None or i in layers:
                out[f"layers.{i}.kda.conv"] = s.conv
                out[f"layers.{i}.kda.recurrent"] = s.recurrent
        for i, c in self.dsa.items():
            if layers is None or i in layers:
                for name in ("latent", "index_key", "index_gate", "pooled_key"):
                    out[f"layers.{i}.dsa.{name}"] = getattr(c, name)
        return out


def room(spec: ModelSpec, tokens: int) -> int:
    """Cache slots for `tokens` tokens: whole pools."""
    kp = spec.indexer.kpool
    return max(-(-tokens // kp) * kp, kp)


def empty_state(spec: ModelSpec, rows: int, max_context: int, num: Numerics = FP32) -> DecodeState:
    """Zero states at position 0 for every row, with room for max_context tokens."""
    max_context = room(spec, max_context)
    st = spec.shards(1).state_shapes(rows, max_context)
    z = lambda k: torch.zeros(st[k], dtype=num.dtype)
    state = DecodeState(torch.zeros(rows, dtype=torch.long), max_context)
    for i, (attn, _) in enumerate(spec.layers):
        if attn == "kda":
            state.kda[i] = KdaState(z("kda.conv"), z("kda.recurrent"))
        else:
            state.dsa[i] = DsaCache(z("dsa.latent"), z("dsa.index_key"), z("dsa.index_gate"), z("dsa.pooled_key"))
    return state


def conv_slice(conv: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    """Rank's channels of the q|k|v conv state [R, W-1, 3P]: its slice of each of q, k and v."""
    R, W1, C = conv.shape
    return conv.view(R, W1, 3, tp, C // (3 * tp))[:, :, :, rank].reshape(R, W1, -1)


def conv_join(parts: list[torch.Tensor]) -> torch.Tensor:
    R, W1, _ = parts[0].shape
    return torch.stack([p.view(R, W1, 3, -1) for p in parts], dim=3).reshape(R, W1, -1)


def head_slice(x: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    return x.chunk(tp, dim=1)[rank]


class Reference:
    """The reference of one model at one TP width, over one set of weights."""

    def __init__(
        self, weights: Weights, tp: int = 1, num: Numerics = FP32, follow: dict | None = None, tie: float = 1.0
    ) -> None:
        self.spec = weights.spec
        self.spec.check_tp(tp)
        self.weights = weights
        self.tp = tp
        self.num = num
        # a launch's discrete choices ("moe.ids", "dsa.idx") to take where the reference's own scores tie them:
        # a launch and the reference differ by bf16 hand-offs, and a top-k at a near-tie may go either way
        self.follow = follow or {}
        # how near a tie must be to be followed, in the ops' ROUTE_TIE / SELECT_TIE (infinite: always, a step's
        # check, which proves each choice on the launch's own inputs instead)
        self.tie = tie

    def _followed(self, i: int, name: str) -> torch.Tensor | None:
        """The launch's choice for layer i (a step's `layers.{i}.<name>`, or a layer launch's `<name>`)."""
        return self.follow.get(f"layers.{i}.{name}", self.follow.get(name))

    def _reduce(self, partials: list[torch.Tensor]) -> torch.Tensor:
        """The all-reduce: partials summed in rank order (fixed, so deterministic)."""
        total = partials[0]
        for p in partials[1:]:
            total = total + p
        return total

    # ---- embed and tail ----------------------------------------------------------------

    def embed(self, tokens: torch.Tensor) -> Tensors:
        check_tokens(tokens, self.spec.model.vocab_size)
        name = f"{ROOT}embed_tokens.weight"
        h = self._reduce(
            [embed_partial(tokens, self.weights.shard(name, r, self.tp), r, self.num) for r in range(self.tp)]
        )
        return {"H": streams(h, self.spec.mhc.streams, self.num)}

    def tail(self, H: torch.Tensor) -> Tensors:
        h_hat = final_norm(H, self.weights.shard(f"{ROOT}norm.weight"), self.spec.model.rms_norm_eps, self.num)
        shards = [
            logits_shard(h_hat, self.weights.shard("lm_head.weight", r, self.tp), self.num) for r in range(self.tp)
        ]
        return {"h_hat": h_hat, "logits": torch.cat(shards, dim=-1)}

    # ---- one layer -----------------------------------------------------------------------

    def _gate(self, i: int, site: str, H: torch.Tensor):
        w = self.weights.layer(i)
        norm = "input_layernorm" if site == "attn" else "post_attention_layernorm"
        return gate(
            H, w[f"hc_{site}_fn"], w[f"hc_{site}_base"], w[f"hc_{site}_scale"], w[f"{norm}.weight"], self.spec, self.num
        )

    def _kda(self, i: int, x_hat: torch.Tensor, s: KdaState) -> tuple[torch.Tensor, KdaState]:
        outs, convs, recs = [], [], []
        for r in range(self.tp):
            local = KdaState(conv_slice(s.conv, r, self.tp), head_slice(s.recurrent, r, self.tp))
            out, new = kda_attention(
                x_hat, self.weights.layer(i, r, self.tp).sub("self_attn."), local, self.spec, self.num
            )
            outs.append(out)
            convs.append(new.conv)
            recs.append(new.recurrent)
        return self._reduce(outs), KdaState(conv_join(convs), torch.cat(recs, dim=1))

    def _dsa(self, i: int, x_hat: torch.Tensor, c: DsaCache, pos: torch.Tensor):
        outs = []
        first = None
        for r in range(self.tp):
            w = self.weights.layer(i, r, self.tp).sub("self_attn.")
            res = dsa_attention(x_hat, w, c, pos, self.spec, self.num, self._followed(i, "dsa.idx"), self.tie)
            outs.append(res.out)
            if first is None:
                first = res
            elif not torch.equal(res.idx, first.idx):  # a replicated indexer must agree on every rank
                raise AssertionError(f"layer {i}: rank {r} selected other tokens than rank 0")
        return self._reduce(outs), first.idx, first.cache

    def _ffn(self, i: int, x_hat: torch.Tensor) -> tuple[torch.Tensor, Tensors]:
        lim = self.spec.moe.swiglu_limit
        if self.spec.ffn_type(i) == "dense":
            parts = []
            for r in range(self.tp):
                w = self.weights.layer(i, r, self.tp).sub("mlp.")
                parts.append(
                    swiglu_mlp(x_hat, w["gate_proj.weight"], w["up_proj.weight"], w["down_proj.weight"], lim, self.num)
                )
            return self._reduce(parts), {}
        parts, routing = [], None
        for r in range(self.tp):
            w = self.weights.layer(i, r, self.tp).sub("mlp.")
            out, ids, wts = moe(x_hat, w, self.spec, self.num, self._followed(i, "moe.ids"), self.tie)
            parts.append(out)
            routing = routing or {"moe.ids": ids, "moe.weights": wts}
        return self._reduce(parts), routing

    def layer(self, i: int, H: torch.Tensor, state: DecodeState) -> tuple[Tensors, DecodeState]:
        """One layer: gate, attention, reduce, hc_post, gate, FFN, reduce, hc_post. State is not mutated."""
        out: Tensors = {}
        x_hat, post, comb = self._gate(i, "attn", H)
        out |= {"attn.x_hat": x_hat, "attn.post": post, "attn.comb": comb}
        new = DecodeState(state.pos, state.max_context, dict(state.kda), dict(state.dsa))
        if self.spec.layer_type(i) == "kda":
            a, new.kda[i] = self._kda(i, x_hat, state.kda[i])
        else:
            a, idx, new.dsa[i] = self._dsa(i, x_hat, state.dsa[i], state.pos)
            out["dsa.idx"] = idx
        out["attn.out"] = a
        H = hc_post(a, H, post, comb, self.num)
        out["attn.H"] = H
        x_hat, post, comb = self._gate(i, "ffn", H)
        out |= {"ffn.x_hat": x_hat, "ffn.post": post, "ffn.comb": comb}
        m, routing = self._ffn(i, x_hat)
        out |= routing
        out["ffn.out"] = m
        out["H"] = hc_post(m, H, post, comb, self.num)
        return out, new

    # ---- the whole step ------------------------------------------------------------------

    def check_room(self, state: DecodeState) -> None:
        if int(state.pos.max()) >= state.max_context:
            raise UsageError(f"a row is at position {int(state.pos.max())}, past the cache of {state.max_context}")

    def step(self, tokens: torch.Tensor, state: DecodeState) -> tuple[Tensors, DecodeState]:
        """embed, every layer, tail: logits and the state after the step (positions advanced)."""
        self.check_room(state)
        outputs: Tensors = {}
        H = self.embed(tokens)["H"]
        outputs["embed.H"] = H
        for i in range(self.spec.model.num_layers):
            res, state = self.layer(i, H, state)
            H = res["H"]
            for k in ("H", "dsa.idx", "moe.ids", "moe.weights"):
                if k in res:
                    outputs[f"layers.{i}.{k}"] = res[k]
        outputs |= self.tail(H)
        return outputs, advance(state)

    # ---- prefill-shaped: independent formulation, and a way to reach a context length --------

    def prefill(self, tokens: torch.Tensor, max_context: int | None = None) -> tuple[Tensors, DecodeState]:
        """One row's T tokens at once, from empty state, TP1 math: (per-position outputs, state at T).

        KDA as a whole-sequence conv and a recurrence from zero, DSA unabsorbed with pools recomputed
        from the raw keys: independent of `step` in everything that carries state.
        """
        check_tokens(tokens, self.spec.model.vocab_size)
        T = tokens.shape[0]
        state = empty_state(self.spec, 1, max(T, max_context or 0), self.num)
        H = self.embed(tokens)["H"]  # [T, hc, D]: positions play the role of rows
        out: Tensors = {}
        for i in range(self.spec.model.num_layers):
            w = self.weights.layer(i).sub("self_attn.")
            x_hat, post, comb = self._gate(i, "attn", H)
            if self.spec.layer_type(i) == "kda":
                a, state.kda[i] = kda_attention_prefill(x_hat, w, self.spec, self.num)
            else:
                a, idx, cache = dsa_attention_prefill(x_hat, w, self.spec, self.num)
                state.dsa[i] = pad_cache(cache, state.max_context, self.spec.indexer.kpool)
                out[f"layers.{i}.dsa.idx"] = idx
            H = hc_post(a, H, post, comb, self.num)
            x_hat, post, comb = self._gate(i, "ffn", H)
            m, _ = self._ffn(i, x_hat)
            H = hc_post(m, H, post, comb, self.num)
            out[f"layers.{i}.H"] = H
        out |= self.tail(H)
        state.pos = torch.tensor([T])
        return out, state


def advance(state: DecodeState) -> DecodeState:
    return DecodeState(state.pos + 1, state.max_context, state.kda, state.dsa)


def pad_cache(c: DsaCache, max_context: int, kpool: int) -> DsaCache:
    """A prefill's caches (length T) in a state's cache of max_context slots."""

    def pad(t: torch.Tensor, n: int) -> torch.Tensor:
        z = t.new_zeros((t.shape[0], n, *t.shape[2:]))
        z[:, : t.shape[1]] = t
        return z

    return DsaCache(
        pad(c.latent, max_context),
        pad(c.index_key, max_context),
        pad(c.index_gate, max_context),
        pad(c.pooled_key, max_context // kpool),
    )


def merge_rows(states: list[DecodeState]) -> DecodeState:
    """Rows prefilled one by one (each R = 1, same cache room), joined into one state."""
    max_context = states[0].max_context
    assert all(s.max_context == max_context for s in states)
    out = DecodeState(torch.cat([s.pos for s in states]), max_context)
    for i in states[0].kda:
        out.kda[i] = KdaState(*(torch.cat([getattr(s.kda[i], n) for s in states]) for n in ("conv", "recurrent")))
    for i in states[0].dsa:
        out.dsa[i] = DsaCache(
            *(torch.cat([getattr(s.dsa[i], n) for s in states]) for n in DsaCache.__dataclass_fields__)
        )
    return out
