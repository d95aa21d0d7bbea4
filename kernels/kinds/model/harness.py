"""One key of `model`: a whole decode step (several in a row) as its parts' launches, chained.

A step is `embed`, then each layer in the model's order as its layer kind's launch (`dense`, `kda`, `sparse`; each
with its TP peers as that kind's harness makes them), then `tail`. Every part is its own kind's harness with its
own knobs, so a step is proven of the same launches the layer kinds prove one by one, and its data stays on the
device from the token ids to the logits: a layer's H is the next one's input, its states the next step's.

For `check` and `fault` the step looks like one launch (`StepLaunches`): its guarded waits are its parts' sites
numbered in step order, and a fault names the part (the layer and its kind), the task and the site. A step's
cache writes are at each row's position and its states are written to new tensors, so a faulted step retried
from the same inputs gives the clean step's bits.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds import get_kind, load_harness
from glm53ctl.kernels.kinds.dense.harness import LayerInput
from glm53ctl.kernels.kinds.harness import Inputs, KindHarness, RunKey, Timed, model_state, row_contexts
from glm53ctl.kernels.kinds.model import BOUNDS
from glm53ctl.kernels.kinds.model.ranks import greedy_on_rank
from glm53ctl.kernels.kinds.model.step import SHAPE_KIND, ModelInput, cache_writes, written_at
from glm53ctl.kernels.kinds.sparse.harness import CACHE_NAMES, SparseInput, check_contexts
from glm53ctl.kernels.numerics import FP32
from glm53ctl.kernels.ops.dsa.naive import dsa_attention
from glm53ctl.kernels.ops.ffn.naive import route
from glm53ctl.kernels.reference import DecodeState, Reference, conv_join, room
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.ranks import RankLayout, run_ranks
from glm53ctl.kernels.state import DsaCache, KdaState
from glm53ctl.kernels.weights import L2_BYTES, Weights, tensor_table

# steps a check runs in a row: the second reads the states and caches the first wrote
STEPS = 2


def step_contexts(spec, rows: int, context: int | None) -> list[int]:
    """The rows' contexts of a step: `context` less 3 a row (as every kind's), or the check's (below and above
    the selection width) without one."""
    return check_contexts(spec, rows) if context is None else row_contexts(context, rows, spec.indexer.kpool)


class StepLaunches:
    """A step's launches as `check` and `fault` see one launch: `table.sites` (every part's guarded waits, in
    step order), `runtime.epoch` (the steps in which every part's launch advanced its tag exactly once)."""

    def __init__(self, parts: list[tuple[str, object]]) -> None:
        self.parts = parts
        self.offsets, sites = [], []
        for _, h in parts:
            self.offsets.append(len(sites))
            sites += list(h.launch.table.sites)
        self.table = SimpleNamespace(sites=sites, n_tasks=sum(h.launch.table.n_tasks for _, h in parts))
        self.runtime = SimpleNamespace(epoch=0)

    def locate(self, site: int) -> tuple[int, int]:
        """The part holding step site `site`, and the site's number in that part's launch."""
        if not 0 <= site < len(self.table.sites):
            raise IndexError(f"site {site}: the step has sites 0..{len(self.table.sites) - 1}")
        for j in reversed(range(len(self.parts))):
            if site >= self.offsets[j]:
                return j, site - self.offsets[j]
        raise IndexError(site)

    def epochs(self) -> list[int]:
        return [h.launch.runtime.epoch for _, h in self.parts]


class ModelHarness(KindHarness):
    kind = "model"
    input_name = "tokens"
    STAGES = ()
    # each part's grids and repeats are proven by its own kind's check: the step checks one other grid, once again
    CHECK_GRIDS = (3,)
    CHECK_REPEATS = 1
    POISON_INT = {"dsa.idx": -2}  # as `sparse`: -1 is the selection's padding
    FAULT_OPTIONS = {"steps": 1}  # one step a launch (a check runs two; a stuck site is in the first anyway)
    RANK_LAUNCHES = 1  # `check --gpus`: one call, two steps in a row (the second reads the states the first wrote)
    BENCH_OPTIONS = {"timing": True}  # layers share weights where a step's do not fit

    def __init__(self, weights: Weights, key: ResolvedKey, layer=None, steps=STEPS, timing: bool = False) -> None:
        super().__init__(weights, key)
        spec, tp, rows, device, context = self.spec, self.tp, self.rows, self.device, key.context
        self.steps = 1 if timing else steps
        # where every layer's weights (all ranks': the peers are emulated here) do not fit, layers share
        self.sets = weight_sets(spec, tp, rows, device, timing)
        if self.sets is not None:
            weights = self.weights = weights.share_layers(self.sets)
        self.contexts = step_contexts(spec, rows, context)
        self.slots = room(spec, max(self.contexts) + steps)
        # each part its own kind's key (resolved with the step's: a grid given to the step is every part's)
        make = lambda kind, **kw: load_harness(kind)(weights, key.part(kind), **kw)  # noqa: E731
        parts = [("embed", make("embed"))]
        for i, shape in enumerate(spec.layers):
            kind = SHAPE_KIND[shape]
            if get_kind(kind).reads_context:
                h = load_harness(kind)(weights, replace(key.part(kind), context=max(self.contexts)), i, self.steps)
            else:
                h = make(kind, layer=i)
            if get_kind(kind).reads_context:
                h.contexts, h.slots = self.contexts, self.slots  # the step's rows, one capacity for every layer
            parts.append((f"layers.{i}", h))
            if timing and self.sets is not None:
                weights.drop_raw()  # a timed step reads prepared weights only (stock ones come back on demand)
        parts.append(("tail", make("tail")))
        self.launch = StepLaunches(parts)
        self.parts = dict(parts)
        # the choices the step's layers make that the reference follows (each part kind's FOLLOWED)
        self.followed = tuple(dict.fromkeys(n for _, h in parts for n in h.FOLLOWED))
        chain(parts, self.knobs.chain)
        self.chosen: list[dict] = []  # each step's routing and selection: what the reference follows at a near-tie

    @classmethod
    def build_launches(cls, spec, key: ResolvedKey, steps: int = STEPS) -> list[tuple[str, object]]:
        """Every part's launches, under the part's name (`layers.3.launch`, ...), each at its part's key; the
        caches sized for `steps` steps (a check's two; a timed step's one: `bench`'s)."""
        longest = key.context if key.context is not None else max(check_contexts(spec, key.rows))
        out = []
        parts = [("embed", "embed")] + [(f"layers.{i}", SHAPE_KIND[s]) for i, s in enumerate(spec.layers)]
        for name, kind in parts + [("tail", "tail")]:
            part, kw = key.part(kind), {}
            if get_kind(kind).reads_context:  # the check's caches
                part, kw = replace(part, context=longest), {"steps": steps}
            for n, la in load_harness(kind).build_launches(spec, part, **kw):
                if n == "launch":  # a peer's launch is emulation; a stage launch is chained already
                    la.pdl = key.knobs.chain == "pdl"
                out.append((f"{name}.{n}", la))
        return out

    @property
    def bounds(self) -> dict[str, float]:
        """Every output's bound: each layer's H and state writes, the logits (the kind's BOUNDS by name's end)."""

        names = ["embed.H", "h_hat", "logits"]
        for i, (att, _) in enumerate(self.spec.layers):
            names.append(f"layers.{i}.H")
            names += [f"layers.{i}.moe.weights"] if self.spec.ffn_type(i) == "moe" else []
            names += [f"layers.{i}.kda.{n}" for n in ("conv", "recurrent")] if att == "kda" else []
            names += [f"layers.{i}.dsa.{n}" for n in CACHE_NAMES] if att == "dsa" else []
        return {n: next(b for end, b in BOUNDS.items() if n.endswith(end)) for n in names}

    def peer_partials(self, x):
        return None  # each part makes its own peers' partials

    def inputs(self, seed: int, steps: int = 1, tokens=None) -> list[ModelInput]:
        """Seeded token ids for `self.steps` steps, every KDA layer's state drawn at random and every DSA layer's
        caches random (bf16 normal rows), with the rows at the check's contexts; one input per `steps`."""
        gen = Inputs(self.spec, seed, FP32)
        out = []
        for _ in range(steps):
            ids = torch.stack([gen.tokens(self.rows) for _ in range(self.steps)])
            if tokens is not None:
                ids[0] = torch.tensor(tokens)  # the first step's, as `run` takes them
            kda, dsa = {}, {}
            for i, (att, _) in enumerate(self.spec.layers):
                if att == "kda":
                    kda[i] = gen.kda_state(self.rows)
                else:
                    dsa[i] = self._random_caches(gen)
            out.append(ModelInput(ids, torch.tensor(self.contexts), kda, dsa))
        return out

    def _random_caches(self, gen: Inputs) -> DsaCache:
        m, ix, R, L = self.spec.mla, self.spec.indexer, self.rows, self.slots
        r = lambda *s: (gen.rows_normal(*s) * 0.5).to(torch.bfloat16)  # noqa: E731
        return DsaCache(
            r(R, L, m.kv_lora_rank), r(R, L, ix.head_dim), r(R, L, ix.head_dim), r(R, L // ix.kpool, ix.head_dim)
        )

    def __call__(self, x: ModelInput, peers=None, poison: bool = False, stuck_site: int = -1, budget_ns=None):
        """`self.steps` steps from x's states, each step's token ids x.tokens[s]: the last step's outputs (every
        layer's H, routing and selection, the logits) and the states and caches after it. `stuck_site` sticks
        that step site in the first step."""
        x = x.to(self.device)
        stuck = self.launch.locate(stuck_site) if stuck_site >= 0 else None
        before = self.launch.epochs()
        kda, dsa, pos = dict(x.kda), dict(x.dsa), x.pos.long()
        self.chosen, self.seen = [], []
        for s in range(self.steps):
            seen: dict = {"pos": pos}  # what each layer's choices are proven on (`invariants`)
            H = self._part(0, x.tokens[s], poison, stuck, s, budget_ns)["H"]
            out: dict[str, torch.Tensor] = {"embed.H": H}
            for j, (name, h) in enumerate(self.launch.parts[1:-1], start=1):
                i = h.layer
                if i in dsa:
                    o = self._part(j, SparseInput(H, pos, dsa[i]), poison, stuck, s, budget_ns)
                    seen[f"{name}.caches"] = dsa[i]
                    dsa[i] = h.cache_after
                    out[f"{name}.dsa.idx"] = o["dsa.idx"]
                else:
                    o = self._part(j, LayerInput(H, kda[i]), poison, stuck, s, budget_ns)
                    kda[i] = KdaState(o["kda.conv"], o["kda.recurrent"])
                out |= {f"{name}.{n}": o[n] for n in ("moe.ids", "moe.weights") if n in o}
                seen |= {f"{name}.{n}": o[n] for n in ("attn.x_hat", "ffn.x_hat")}
                H = o["H"]
                out[f"{name}.H"] = H
            out |= self._part(len(self.launch.parts) - 1, H, poison, stuck, s, budget_ns)
            self.chosen.append({n: t for n, t in out.items() if n.endswith(self.followed)})
            self.seen.append(seen)
            pos = pos + 1
        if [b - a for a, b in zip(before, self.launch.epochs(), strict=True)] == [self.steps] * len(before):
            self.launch.runtime.epoch += 1
        self.state_after = after = DecodeState(pos, self.slots, kda, dsa)
        self.untouched = all(self._only_written(x.dsa[i], after.dsa[i], x.pos.long()) for i in dsa)
        return out | self._writes(x.pos.long(), after)

    def _writes(self, pos0: torch.Tensor, state: DecodeState) -> dict[str, torch.Tensor]:
        """What a step writes: every KDA layer's states; of every DSA layer's caches, the slots the steps wrote
        ([R, steps, ...]: a cache's other slots are the input's, `untouched`)."""
        out = {n: t for n, t in state.tensors().items() if ".kda." in n}
        at = written_at(pos0.to(state.pos.device), self.steps, self.spec.indexer.kpool)
        for i, c in state.dsa.items():
            out |= cache_writes(i, c, at)
        return out

    def _only_written(self, before: DsaCache, after: DsaCache, pos0: torch.Tensor) -> bool:
        """Whether a DSA layer's caches after the steps equal those before but for the slots the steps wrote."""
        ok = True
        for n in CACHE_NAMES:
            want = getattr(before, n).clone()
            got = getattr(after, n)
            for r, p, q in written_at(pos0, self.steps, self.spec.indexer.kpool):
                slot = q if n == "pooled_key" else p
                want[r, slot] = got[r, slot]
            ok &= torch.equal(want, got)
        return ok

    def _part(self, j: int, x, poison: bool, stuck, step: int, budget_ns):
        """Part j's launch (with its peers) on x; a fault of its launch renamed to the step's site."""
        name, h = self.launch.parts[j]
        guard = {"budget_ns": budget_ns} if budget_ns else {}
        if stuck is not None and stuck[0] == j and step == 0:
            guard["stuck_site"] = stuck[1]
        try:
            return h(x, None, poison=poison, **guard)
        except LaunchFault as e:
            what = f"model step {step}: {name} ({h.kind})"
            site = self.launch.offsets[j] + e.site
            raise LaunchFault(what, site, e.task, e.producer, e.program, e.expected, e.seen) from None

    def reference(self, x: ModelInput) -> dict[str, torch.Tensor]:
        """The reference's steps from x's states at this TP width (its weights' device), taking the launch's
        routing and selection at every layer: the last step's outputs and the states.

        A step carries every earlier layer's error (on glm53_flash, H's relative error reaches about 3e-2 at the
        last layer), so deep in the step a router score can move past the near-tie margin of one layer's check
        and the reference, on its own inputs, choose otherwise; its outputs would then differ by a whole expert.
        So the reference takes the launch's choices, and `invariants` proves each of them on the launch's own
        inputs instead (the exact top-k of the scores of the x̂ it routed, near-ties as each layer's check)."""
        dev = self.weights.device
        x = x.to(dev)
        kda = {i: KdaState(s.conv.float(), s.recurrent.float()) for i, s in x.kda.items()}
        dsa = {i: DsaCache(*(getattr(c, n).float() for n in CACHE_NAMES)) for i, c in x.dsa.items()}
        state = DecodeState(x.pos.long(), self.slots, kda, dsa)
        for s in range(self.steps):
            follow = self.chosen[s] if s < len(self.chosen) else None
            ref = Reference(self.weights, self.tp, follow=follow, tie=math.inf)
            out, state = ref.step(x.tokens[s], state)
        return out | self._writes(x.pos.long(), state)

    def invariants(self, out: dict, ref: dict) -> dict[str, bool]:
        """Every layer's routing and selection at every step the exact top-k of the scores of its own inputs
        (near-ties followed, as each layer kind's check); the caches written at each row's positions only."""
        off = self.off_choices()
        name = "every layer's routing and selection the exact top-k of its own inputs (near-ties followed)"
        return {
            name + (f": not at {', '.join(off[:3])}" if off else ""): not off,
            "caches written at each row's positions only": self.untouched,
        }

    def off_choices(self) -> list[str]:
        """The choices of the last call that are not the exact top-k of the launch's own inputs' scores (the x̂
        the layer routed or indexed, the caches it read, in fp32), near-ties within ROUTE_TIE / SELECT_TIE:
        `layers.3.dsa.idx (step 1)`, ..."""

        spec, dev, off = self.spec, self.weights.device, []
        for s, (chosen, seen) in enumerate(zip(self.chosen, self.seen, strict=True)):
            for n, theirs in chosen.items():
                layer, i = n.rsplit(".", 2)[0], int(n.split(".")[1])
                w = self.weights.layer(i, 0, self.tp)
                if n.endswith("moe.ids"):
                    x = seen[f"{layer}.ffn.x_hat"].to(dev, torch.float32)
                    bias = w["mlp.gate.e_score_correction_bias"]
                    ids, _ = route(x, w["mlp.gate.weight"], bias, spec, FP32, follow=theirs)
                    theirs = theirs.long().sort(-1).values  # the router's ids come ascending
                else:
                    x = seen[f"{layer}.attn.x_hat"].to(dev, torch.float32)
                    caches = DsaCache(*(getattr(seen[f"{layer}.caches"], c).to(dev).float() for c in CACHE_NAMES))
                    pos = seen["pos"].to(dev)
                    ids = dsa_attention(x, w.sub("self_attn."), caches, pos, spec, FP32, follow=theirs).idx
                if not torch.equal(ids.cpu(), theirs.long().cpu()):
                    off.append(f"{n} (step {s})")
        return off

    @classmethod
    def run(cls, weights: Weights, key: RunKey, resolved: ResolvedKey) -> dict[str, torch.Tensor]:
        """`run --backend triton`: run_reference's inputs (every row prefilled to its context by the reference,
        the first step's token ids drawn, or --tokens) through the step's launches, `key.steps` steps, each
        next token the argmax of the logits (greedy), every state carried."""
        # caches with room for every step; then one step a call, each next token from the last logits
        k = cls(weights, replace(resolved, context=key.context), steps=key.steps)
        k.steps = 1
        contexts, x = cls.run_input(weights, key, k.contexts, k.slots)
        for _ in range(key.steps):
            before = x
            out = k(x)
            after = k.state_after
            x = ModelInput(out["logits"].argmax(-1).cpu()[None], after.pos, after.kda, after.dsa)
        state = DecodeState(before.pos, k.slots, before.kda, before.dsa)
        return cls.run_saved(contexts, before.tokens[0], state, out, after)

    @classmethod
    def run_input(cls, weights: Weights, key: RunKey, contexts, slots: int) -> tuple[list[int], ModelInput]:
        """A run's first step: run_reference's inputs (every row prefilled to its context by the reference, the
        first step's token ids drawn, or --tokens), caches with room for `slots` tokens."""
        inputs = Inputs(weights.spec, key.seed, FP32)
        st = model_state(Reference(weights), contexts, inputs, slots)
        tokens = inputs.tokens(key.rows, key.tokens)
        kda = {i: KdaState(s.conv.to(torch.bfloat16), s.recurrent) for i, s in st.kda.items()}
        dsa = {i: DsaCache(*(getattr(c, n).to(torch.bfloat16) for n in CACHE_NAMES)) for i, c in st.dsa.items()}
        return contexts, ModelInput(tokens[None], st.pos.clone(), kda, dsa)

    @staticmethod
    def run_saved(contexts, tokens, before: DecodeState, out: dict, after: DecodeState) -> dict:
        """What `run` saves: the last step's inputs (its token ids, positions, the states before it), its outputs
        (every layer's H, routing and selection, the logits) and the states after it."""
        shown = {
            n: t for n, t in out.items() if not n.startswith("layers.") or n.endswith((".H", "moe.ids", "dsa.idx"))
        }
        shown |= {n: t for n, t in out.items() if n.endswith("moe.weights")}
        return (
            {"inputs.contexts": torch.tensor(contexts), "inputs.tokens": tokens.cpu()}
            | {"inputs.pos": before.pos.cpu()}
            | {f"inputs.state.{n}": t.float().cpu() for n, t in before.tensors().items()}
            | {f"outputs.{n}": t.cpu() for n, t in shown.items()}
            | {f"writes.{n}": t.float().cpu() for n, t in after.tensors().items()}
        )

    @classmethod
    def run_ranks(
        cls, weights: Weights, key: RunKey, resolved: ResolvedKey, source, rank_fn=None
    ) -> dict[str, torch.Tensor]:
        """`run --backend triton --gpus T`: `run`'s greedy steps on T real ranks (kinds/model/ranks.py
        `greedy_on_rank`: every rank picks each next token from the whole logits it has); what `run` saves, the
        states joined from the ranks' slices (the KDA states; the caches every rank writes whole, rank 0's), and
        every rank's outputs of the last step as `ranks.<r>.*`. A rank whose launch faults fails the run."""

        spec, tp = weights.spec, resolved.tp
        contexts = step_contexts(spec, key.rows, key.context)
        slots = room(spec, max(contexts) + key.steps)
        contexts, x0 = cls.run_input(weights, key, contexts, slots)
        layout = RankLayout(tp, tp, torch.device(resolved.device).type)
        # every rank prepares every layer and (on a GPU) compiles every part first: more than a layer's 600 s
        out = run_ranks(layout, greedy_on_rank, resolved, x0.to("cpu"), key.steps, source, timeout_s=3600.0)

        def joined(step: int, pos) -> DecodeState:
            """The states after step `step` of the last two (-1, -2), from every rank's."""
            per = [o["last"][step] for o in out]
            kda = {}
            for i in x0.kda:
                conv = conv_join([p[f"layers.{i}.kda.conv"] for p in per])
                kda[i] = KdaState(conv, torch.cat([p[f"layers.{i}.kda.recurrent"] for p in per], dim=1))
            dsa = {i: DsaCache(*(per[0][f"layers.{i}.cache.{n}"] for n in CACHE_NAMES)) for i in x0.dsa}
            return DecodeState(pos, slots, kda, dsa)

        # the positions as the one-device run carries them (its steps after the first count in int64)
        last_pos = x0.pos.long() + key.steps - 1 if key.steps > 1 else x0.pos
        before = joined(-2, last_pos) if key.steps > 1 else DecodeState(last_pos, slots, x0.kda, x0.dsa)
        saved = cls.run_saved(contexts, out[0]["tokens"][-1], before, out[0]["last"][-1], joined(-1, last_pos + 1))
        shown = [n[len("outputs.") :] for n in saved if n.startswith("outputs.")]
        return saved | {f"ranks.{r}.{n}": out[r]["last"][-1][n].clone() for r in range(tp) for n in shown}

    # bench (tuning/bench.py): the step's rank-0 launches as a serving engine replays them

    def chained(self, x: ModelInput) -> list[tuple]:
        """Every part of a timed step, step 0 of x: (name, harness, input, the peers' partials, its Timed, the
        copy it reads), each layer's H the part before's result buffer (its `Timed.output`), the peers' partials
        made from it once; embed reads x's token ids."""
        x = x.to(self.device)
        out, prev = [], None
        for name, h in self.launch.parts:
            if name == "embed":
                xin = x.tokens[0]
            elif name == "tail":
                xin = prev
            elif h.layer in x.dsa:
                xin = SparseInput(prev, x.pos, x.dsa[h.layer])
            else:
                xin = LayerInput(prev, x.kda[h.layer])
            peers = h.peer_partials(xin)
            t = h.timed(xin, peers)
            c = {"tokens": xin} if name == "embed" else t.copies(1)[0]
            t.call(c)  # its result is the next part's input
            if hasattr(h, "cache_after"):
                h.cache_after = None  # the caches' copy of the check's path: not needed here
            out.append((name, h, xin, peers, t, c))
            prev = t.output
        return out

    def timed(self, x: ModelInput, peers) -> Timed:
        """One step as bench times it: every part's rank-0 launch in step order (chained as the `chain` knob
        says), each layer reading the part before's H where it wrote it; the peers' partials made once. It
        moves every part's bytes (the experts each layer's rows chose). `timed_parts`: each part's own Timed."""
        self._chain = self.chained(x)
        parts = [(t, c) for *_, t, c in self._chain]
        self.timed_parts = [(name, h.kind, t) for name, h, _, _, t, _ in self._chain]

        def call(_) -> None:
            for t, c in parts:
                t.call(c)

        what = "nothing: the step's layers share weights in turn" if self.sets else "nothing (every layer its own)"
        self._main = Timed(
            call,
            lambda n: [None] * n,
            sum(t.stream_bytes for t, _ in parts),
            sum(t.nbytes for t, _ in parts),
            what + self.sharing(),
            parts[-1][0].output,
            launches=len(parts),
        )
        return self._main

    def sharing(self) -> str:
        """How a timed step keeps its launches' weights out of the L2, in words (bench's output says it)."""
        if not self.sets:
            return ""
        src = [self.weights.source_layer(h.layer) if hasattr(h, "layer") else None for _, h in self.launch.parts]
        bytes_ = [t.stream_bytes for *_, t, _ in getattr(self, "_chain", [])]
        gap = _reuse_gap(src, bytes_) if bytes_ else None
        line = f" ({self.sets} layers' weights per layer shape, read in turn"
        return line + (f"; a layer's weights come back after {gap / 1e6:.0f} MB or more streamed)" if gap else ")")

    def schedules(self, x: ModelInput, peers) -> dict[str, Timed]:
        """The step under the other `chain` value, the same launches (`bench --baseline chain` times it beside
        the step)."""
        other = "stream" if self.knobs.chain == "pdl" else "pdl"
        main = getattr(self, "_main", None) or self.timed(x, peers)

        def call(c) -> None:  # pdl is read when a launch is made: while a graph captures this call
            chain(self.launch.parts, other)
            try:
                main.call(c)
            finally:
                chain(self.launch.parts, self.knobs.chain)

        return {f"chain={other}": replace(main, call=call)}

    def stock(self, x: ModelInput, peers, compile: bool = False) -> Timed:
        """The reference step as stock PyTorch ops in bf16 (each part's `stock`, chained: embed's H into the first
        layer, ..., the last H into tail); with `compile`, each part through `torch.compile` (the layers of a
        shape share one compiled function), the `compile` baseline. Layers that share weights share them here."""
        main = getattr(self, "_main", None) or self.timed(x, peers)
        calls, kept = [], {}
        for name, h, xin, p, _, c in self._chain:
            st = h.stock(xin, p)
            key = (h.kind, self.weights.source_layer(h.layer) if hasattr(h, "layer") else name)
            w = c if name == "embed" else kept.setdefault(key, st.copies(1)[0])
            calls.append((name, st.call, w))
        if compile:
            import torch._dynamo

            # one compiled function per part kind: the same code, each layer's closure (guards, not recompiles)
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(calls))
            torch._dynamo.config.accumulated_cache_size_limit = max(
                torch._dynamo.config.accumulated_cache_size_limit, 8 * len(calls)
            )
            calls = [(n, torch.compile(f, dynamic=False), w) for n, f, w in calls]

        def call(_):
            (_, embed, w0), *layers, (_, tail, wt) = calls
            H = embed(w0)
            for _, f, w in layers:
                H = f(w, H)
            return tail(wt, H)

        return Timed(call, lambda n: [None] * n, main.stream_bytes, main.nbytes, main.what, launches=len(calls))

    def compiled(self, x: ModelInput, peers) -> Timed:
        """The `compile` baseline: each part's stock step compiled on its own (one graph of a step is too big)."""
        return self.stock(x, peers, compile=True)


def chain(parts: list[tuple[str, object]], how: str) -> None:
    """Every part's rank-0 launch chained to the one before by programmatic dependent launch, or not."""
    for _, h in parts:
        if not hasattr(h.launch, "stages"):  # a part in the stage schedule is chained by PDL throughout
            h.launch.pdl = how == "pdl"


def _reuse_gap(sources: list, stream_bytes: list[int]) -> int:
    """The fewest bytes the step streams between two reads of one layer's weights (the step replayed in turn)."""
    gaps = []
    for j, s in enumerate(sources):
        if s is None:
            continue
        between = 0
        for d in range(1, len(sources)):
            k = (j + d) % len(sources)
            if sources[k] == s:
                break
            between += stream_bytes[k]
        gaps.append(between)
    return min(gaps, default=None)


def weight_sets(spec, tp: int, rows: int, device, timing: bool) -> int | None:
    """How many layers' weights each layer shape reads in turn where every layer's own do not fit the device
    (None: they fit; the CPU always takes them). The peers are emulated, so a layer holds all ranks' weights.
    For a check one set (it keeps the checkpoint layout for the reference too); for timing as many as bring a
    layer's weights back only after twice the L2 has streamed (tuning/measure.py `rotations`), as memory allows."""
    import math

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    table = tensor_table(spec)
    per_layer = [0] * len(spec.layers)
    experts = [0] * len(spec.layers)
    for name, info in table.items():
        if ".layers." in name:
            i = int(name.split(".layers.")[1].split(".")[0])
            b = math.prod(info.shape) * info.dtype.itemsize
            per_layer[i] += b
            experts[i] += b if ".mlp.experts." in name else 0
    free = torch.cuda.mem_get_info(dev)[0]
    copies = 1 if timing else 2  # prepared, and for a check the checkpoint layout the reference reads
    if sum(per_layer) * copies <= 0.7 * free:
        return None
    biggest = max(range(len(per_layer)), key=per_layer.__getitem__)
    one_set = sum(max(per_layer[i] for i, s in enumerate(spec.layers) if s == shape) for shape in set(spec.layers))
    fit = max(1, int(0.7 * free // (one_set * copies)))
    if not timing:
        return 1
    E, k = spec.moe.experts, spec.moe.top_k
    read = (per_layer[biggest] - experts[biggest] + min(E, k * rows + 1) * experts[biggest] / E) / tp
    return max(1, min(fit, 1 + math.ceil(2 * L2_BYTES / read)))
