"""Seeded inputs, the reference run of each kind, and the interface of a kind's launch harness: everything
`glm53ctl run` saves and `check` compares.

Inputs are fresh per seed: token ids, the 4-stream H a layer reads, and each row's history up to its
context length (rows sit at different positions in one step). A layer kind brings its own layer's
state to the context by a prefill over random normalized rows; `model` prefills the whole model.
Which function runs which kind is the kind registry's (kernels/kinds/__init__.py: its `reference` loaders).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds.base import KnobRecord
from glm53ctl.kernels.kinds.run_key import RunKey, layer_for, row_contexts
from glm53ctl.kernels.numerics import Numerics
from glm53ctl.kernels.ops.dsa.naive import dsa_attention_prefill
from glm53ctl.kernels.ops.kda.naive import kda_attention_prefill
from glm53ctl.kernels.reference import (
    DecodeState,
    Reference,
    empty_state,
    merge_rows,
    pad_cache,
    room,
)
from glm53ctl.kernels.runtime.ranks import steps_on_ranks
from glm53ctl.kernels.runtime.stages import SeparateLaunches
from glm53ctl.kernels.spec import ModelSpec
from glm53ctl.kernels.state import KdaState

Tensors = dict[str, torch.Tensor]


class Inputs:
    """A seeded stream of inputs; the same seed gives the same tensors on any machine."""

    def __init__(self, spec: ModelSpec, seed: int, num: Numerics) -> None:
        self.spec, self.num = spec, num
        self.gen = torch.Generator().manual_seed(seed)

    def tokens(self, n: int, given: tuple[int, ...] | None = None) -> torch.Tensor:
        drawn = torch.randint(0, self.spec.model.vocab_size, (n,), generator=self.gen)
        return drawn if given is None else torch.tensor(given, dtype=torch.long)

    def rows_normal(self, *shape: int) -> torch.Tensor:
        return self.num.store(torch.randn(shape, generator=self.gen, dtype=torch.float64))

    def kda_state(self, rows: int) -> KdaState:
        """A random KDA state (all heads): conv inputs as after a few tokens (bf16), a recurrent state of the
        size a few hundred tokens leave (fp32)."""
        st = self.spec.shards(1).state_shapes(rows, 1)
        conv = torch.randn(st["kda.conv"], generator=self.gen).to(torch.bfloat16)
        rec = 0.2 * torch.randn(st["kda.recurrent"], generator=self.gen)
        return KdaState(conv, rec)

    def H(self, rows: int) -> torch.Tensor:
        """A layer's input streams: a shared row plus per-stream differences, as after a few layers."""
        D, hc = self.spec.hidden, self.spec.mhc.streams
        base = torch.randn((rows, 1, D), generator=self.gen, dtype=torch.float64)
        return self.num.store(base + 0.5 * torch.randn((rows, hc, D), generator=self.gen, dtype=torch.float64))


def layer_state(ref: Reference, i: int, contexts: list[int], inputs: Inputs, max_context: int) -> DecodeState:
    """Layer i's state with row r at contexts[r], from a prefill over random normalized rows."""
    rows = []
    w = ref.weights.layer(i).sub("self_attn.")
    for L in contexts:
        st = empty_state(ref.spec, 1, max_context, ref.num)
        st.kda = {k: v for k, v in st.kda.items() if k == i}
        st.dsa = {k: v for k, v in st.dsa.items() if k == i}
        if L:
            x = inputs.rows_normal(L, ref.spec.hidden)
            if i in st.kda:
                _, st.kda[i] = kda_attention_prefill(x, w, ref.spec, ref.num)
            else:
                _, _, cache = dsa_attention_prefill(x, w, ref.spec, ref.num)
                st.dsa[i] = pad_cache(cache, st.max_context, ref.spec.indexer.kpool)
        st.pos = torch.tensor([L])
        rows.append(st)
    return merge_rows(rows)


def model_state(ref: Reference, contexts: list[int], inputs: Inputs, max_context: int) -> DecodeState:
    states = []
    for L in contexts:
        if L:
            _, st = ref.prefill(inputs.tokens(L), max_context)
        else:
            st = empty_state(ref.spec, 1, max_context, ref.num)
        states.append(st)
    return merge_rows(states)


def _start(ref: Reference, key: RunKey) -> tuple[Inputs, list[int], int, Tensors]:
    inputs = Inputs(ref.spec, key.seed, ref.num)
    contexts = row_contexts(key.context, key.rows, ref.spec.indexer.kpool)
    return inputs, contexts, room(ref.spec, max(contexts) + key.steps), {"inputs.contexts": torch.tensor(contexts)}


def run_embed(ref: Reference, key: RunKey) -> Tensors:
    inputs, _, _, saved = _start(ref, key)
    for step in range(key.steps):
        tokens = inputs.tokens(key.rows, key.tokens if step == key.steps - 1 else None)
        out = ref.embed(tokens)
    return saved | {"inputs.tokens": tokens} | _prefixed("outputs.", out)


def run_tail(ref: Reference, key: RunKey) -> Tensors:
    inputs, _, _, saved = _start(ref, key)
    for _ in range(key.steps):
        H = inputs.H(key.rows)
        out = ref.tail(H)
    return saved | {"inputs.H": H} | _prefixed("outputs.", out)


def run_model(ref: Reference, key: RunKey) -> Tensors:
    """Decode steps from every row's prefilled context: the first step's token ids drawn (or --tokens), each next
    one the argmax of the logits (greedy); the last step's inputs, outputs and writes."""
    inputs, contexts, max_context, saved = _start(ref, key)
    state = model_state(ref, contexts, inputs, max_context)
    nxt = inputs.tokens(key.rows, key.tokens)
    for _ in range(key.steps):
        tokens, before = nxt, state
        out, state = ref.step(tokens, state)
        nxt = out["logits"].argmax(-1)
    return (
        saved
        | {"inputs.tokens": tokens, "inputs.pos": before.pos}
        | _prefixed("inputs.state.", before.tensors())
        | _prefixed("outputs.", out)
        | _prefixed("writes.", state.tensors())
    )


def run_layer(ref: Reference, key: RunKey) -> Tensors:
    inputs, contexts, max_context, saved = _start(ref, key)
    i = layer_for(ref.spec, key.kind, key.layer)
    state = layer_state(ref, i, contexts, inputs, max_context)
    for _ in range(key.steps):
        H = inputs.H(key.rows)
        before = state
        out, state = ref.layer(i, H, state)
        state = DecodeState(state.pos + 1, state.max_context, state.kda, state.dsa)
    return (
        saved
        | {"inputs.H": H, "inputs.pos": before.pos, "inputs.layer": torch.tensor(i)}
        | _prefixed("inputs.state.", before.tensors([i]))
        | _prefixed("outputs.", out)
        | _prefixed("writes.", state.tensors([i]))
    )


def nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def bf16_numerics() -> Numerics:
    """The stock-PyTorch baselines' numerics: every op in bf16, as a serving stack without fused kernels runs."""
    return Numerics(torch.bfloat16, torch.bfloat16)


@dataclass
class Timed:
    """What `bench` times of one key (tuning/bench.py): one launch reading one copy of what it streams.

    `call(copy)` runs the launch on one copy (a `stock` call also takes its input, `call(copy, x)`, so that a step
    chains them); `copies(n)` makes n copies (the first the harness's own), which
    the timing rotates over so that each launch streams them from HBM, not from the L2; `stream_bytes` is what
    one launch reads of a copy (it sets how many copies that takes); `nbytes` every byte a launch moves
    (weights, states read and written, inputs, the peers' partials, outputs): the floor's bytes."""

    call: Callable[..., object]
    copies: Callable[[int], list[dict]]
    stream_bytes: int
    nbytes: int
    what: str  # what rotates, in words (bench's output says it)
    # the launch's result buffer (H, or the logits), rewritten by every call: what a step's next part reads
    output: torch.Tensor | None = None
    launches: int = 1  # kernel launches per call (a whole step: every part's)


def cloned(first: dict[str, torch.Tensor]) -> Callable[[int], list[dict]]:
    """copies(n) for weights: the harness's own, then clones."""
    return lambda n: [first] + [{k: t.clone() for k, t in first.items()} for _ in range(n - 1)]


class KindHarness:
    """One build key of a kind on one device, with what its TP peers contribute: the interface every kind's
    harness has (the registry's `harness`), and what `check`, `fault`, `run`, `build` and `bench` rely on.

    It is made from a resolved key (`Harness(weights, key)`, kernels/key.py: the knobs in force, the grid for the
    device, the bounds), made once where a command starts the key; a harness reads no tuned file and prints
    nothing. It has: `launch` (rank 0's launch: its `table`, `runtime`, `grid`, `kernel`; a `PersistentLaunch`),
    `inputs(seed, steps, tokens)` (seeded inputs per step), `peer_partials(x)` (the other ranks' share, made
    first on the same device), `__call__(x, peers, poison, **guard)` (every output, and the writes of a kind
    with state), `writes()` (hand-off buffers compared bit for bit too), `reference(x)` (the reference's
    outputs at this TP width), `build_launches(spec, key)` (every launch object of a key, for ahead-of-time
    builds), `run(weights, run_key, key)` (`run --backend triton`), and `STAGES` (its task types grouped into the
    separate launches of the baseline); for `bench`, `timed(x, peers)` (rank 0's launch as it is timed) and
    `stock(x, peers)` (rank 0's share of the same math as stock PyTorch ops in bf16, the `torch` and `compile`
    baselines). What a command asks of a kind beyond that is a class attribute here, with the default most kinds
    take: `FOLLOWED`, `POISON_INT`, `CHECK_GRIDS`, `CHECK_REPEATS`, `FAULT_OPTIONS`,
    `RANK_LAUNCHES`, `BENCH_OPTIONS`."""

    kind: str
    input_name: str  # what run saves as inputs.<name>
    STAGES: tuple = ()
    Launch: type  # the kind's launch class (its `partial_only` mode is a peer rank's launch)
    # the launch's discrete choices (outputs) the reference follows where its own scores tie them (reference.py
    # `follow`; `check` and `tune` hand them over)
    FOLLOWED: tuple[str, ...] = ()
    # an integer output's poison by its name's end (else -1: a kind whose output may hold -1 poisons it otherwise)
    POISON_INT: dict[str, int] = {}
    CHECK_GRIDS = (1, 3, 64)  # the other grids `check` proves bitwise equal
    CHECK_REPEATS = 3  # launches in a row `check` proves bitwise equal (no host reset between)
    FAULT_OPTIONS: dict = {}  # what `fault` makes the harness with (a whole step: one step a launch)
    RANK_LAUNCHES = 3  # launches in a row `check --gpus` proves on real ranks (the mailboxes' halves in turn)
    BENCH_OPTIONS: dict = {}  # what `bench` makes it with (a whole step: timing's weight sharing)

    def __init__(self, weights, key: ResolvedKey) -> None:
        spec = weights.spec
        spec.check_tp(key.tp)
        self.key = key
        self.knobs = key.knobs
        self.tp, self.rows, self.device = key.tp, key.rows, torch.device(key.device)
        self.spec, self.weights = spec, weights

    @classmethod
    def build_launches(cls, spec, key: ResolvedKey) -> list[tuple[str, object]]:
        """Every launch object of a key, laid out on the CPU (nothing runs): rank 0's, and at TP > 1 a peer's."""
        out = [("launch", cls.Launch(spec, key.tp, key.rows, key.knobs, "cpu"))]
        if key.tp > 1:
            out.append(("peer", cls.Launch(spec, key.tp, key.rows, key.knobs, "cpu", partial_only=True)))
        return cls.scheduled_builds(key, out)

    @classmethod
    def stages(cls, knobs: KnobRecord) -> tuple:
        """Its task types grouped into stage launches at these knobs (`STAGES`, where no knob moves a task)."""
        return cls.STAGES

    @classmethod
    def stage_schedule(cls, knobs: KnobRecord) -> bool:
        """Whether knob `launch` runs the key as its stages (runtime/stages.py), not as one persistent launch."""
        return knobs.get("launch", "persistent") == "stages" and bool(cls.STAGES)

    def scheduled(self, launch):
        """Rank 0's launch in the key's schedule (knob `launch`): the persistent launch as it is, or its stages,
        one program per task, chained by programmatic dependent launch."""
        if not self.stage_schedule(self.knobs):
            return launch

        return SeparateLaunches(launch, self.stages(self.knobs), pdl=True, one_task=True)

    @classmethod
    def scheduled_builds(cls, key: ResolvedKey, launches: list[tuple[str, object]]) -> list[tuple[str, object]]:
        """build_launches in the key's schedule: rank 0's launch as its stage launches (`stage3.launch`: each is
        compiled, and `fault` counts its sites) where knob `launch` is stages."""
        if not cls.stage_schedule(key.knobs):
            return launches

        out = []
        for name, la in launches:
            if name == "launch":
                chain = SeparateLaunches(la, cls.stages(key.knobs), pdl=True, one_task=True)
                out += [(f"stage{j}.launch", s) for j, s in enumerate(chain.stages)]
            else:
                out.append((name, la))
        return out

    @property
    def bounds(self) -> dict[str, float]:
        """Every output's bound on its relative RMS error against the reference (the registry's BOUNDS)."""
        return self.key.bounds

    def shard(self, name: str, rank: int) -> torch.Tensor:
        return self.weights.shard(name, rank, self.tp).to(self.device).contiguous()

    def writes(self) -> Tensors:
        return {}

    def invariants(self, out: Tensors, ref: Tensors) -> dict[str, bool]:
        """What `check` proves of a launch's outputs beyond the bounds (a kind's own; the MoE's routing)."""
        return {}

    def reference_model(self) -> Reference:
        """The reference at this TP width; it takes the launch's routing and selection where its own scores tie
        them (`follow`, set by `check` from the launch's outputs)."""
        return Reference(self.weights, self.tp, follow=getattr(self, "follow", None))

    def schedules(self, x, peers) -> dict:
        """The key's launches under each other value of a step's knob `chain`, to time beside it (`bench`'s
        baseline `chain`): a kind of one launch per key has none (the step's harness has the other chain)."""
        return {}

    def separate(self, pdl: bool = False) -> KindHarness:
        """This key as the separate-launches baseline: the same task bodies, one launch per stage; with `pdl`,
        chained by programmatic dependent launch (each stage launch asks for its first weights, then waits for
        the launch before it to end, and lets the next one start as it starts)."""
        import copy

        h = copy.copy(self)
        h.launch = SeparateLaunches(getattr(self.launch, "whole", self.launch), self.stages(self.knobs), pdl=pdl)
        return h

    def timed(self, x, peers) -> Timed:
        raise NotImplementedError(f"{self.kind}: no timed launch")

    def stock(self, x, peers) -> Timed:
        raise NotImplementedError(f"{self.kind}: no stock PyTorch baseline")

    def compiled(self, x, peers) -> Timed:
        """The `compile` baseline: `stock` through `torch.compile`."""
        from dataclasses import replace

        t = self.stock(x, peers)
        return replace(t, call=torch.compile(t.call, dynamic=False))

    @classmethod
    def run(cls, weights, key: RunKey, resolved: ResolvedKey) -> Tensors:
        """`run --backend triton` of a kind with no state: each step's inputs through the launch."""
        k = cls(weights, resolved)
        xs = k.inputs(key.seed, key.steps, key.tokens)
        for x in xs:
            out = k(x)
        return cls.run_inputs(weights.spec, key, xs) | _prefixed("outputs.", {n: t.cpu() for n, t in out.items()})

    @classmethod
    def run_ranks(cls, weights, key: RunKey, resolved: ResolvedKey, source, rank_fn) -> Tensors:
        """`run --backend triton --gpus T` of a kind with no state: each step's inputs on T real ranks
        (`rank_fn`, the kind's rank function; each rank's weights from `source`); what `run` saves,
        rank 0's outputs of the last step as `outputs.*`, and every rank's as `ranks.<r>.*`."""
        k = cls(weights, resolved)
        xs = k.inputs(key.seed, key.steps, key.tokens)
        del k
        out = steps_on_ranks(rank_fn, resolved, xs, source, chain=False)
        saved = cls.run_inputs(weights.spec, key, xs)
        saved |= _prefixed("outputs.", {n: t.clone() for n, t in out[0][-1].items()})
        return saved | {f"ranks.{r}.{n}": t for r in range(resolved.tp) for n, t in out[r][-1].items()}

    @classmethod
    def run_inputs(cls, spec, key: RunKey, xs: list) -> Tensors:
        """What `run` saves of a stateless kind's inputs: the rows' contexts and the last step's input."""
        saved = {"inputs.contexts": torch.tensor(row_contexts(key.context, key.rows, spec.indexer.kpool))}
        saved[f"inputs.{cls.input_name}"] = xs[-1].cpu()
        return saved


def _prefixed(prefix: str, d: Tensors) -> Tensors:
    return {prefix + k: v for k, v in d.items()}
