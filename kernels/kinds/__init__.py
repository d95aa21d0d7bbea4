"""The registry of launch kinds: what every command reads to know a kind (docs/design.md §2).

One entry per kind: what it computes, its reference run (what `glm53ctl run` saves), the layer shape it runs
(for layer kinds), its launch harness (its kernel, launch, table and reference outputs at a key; None until
the kind has kernels), its accuracy bounds, and its knobs (its own, and the runtime's it takes, with its own
defaults). How a kind's knobs become compile-time constants is its launch's `constexprs()`.

Adding a kind is a folder `kernels/kinds/<kind>/` (facts in `__init__.py`: KNOBS, RUNTIME, RUNTIME_DEFAULTS,
BOUNDS; then `table.py`, `kernel.py`, `launch.py`, `harness.py`) and one line below. Nothing outside this
module asks `if kind == ...`. Importing it costs no torch: harnesses and references load when first used.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import MappingProxyType

from glm53ctl.kernels.kinds import dense, embed, kda, model, sparse, tail

_PKG = "glm53ctl.kernels"


@dataclass(frozen=True)
class Kind:
    name: str
    summary: str
    reference_run: str  # "module:function": `glm53ctl run`'s reference run of the kind (kernels/harness.py)
    harness: str | None = None  # "module:Class" of its launch harness; None: no kernels yet
    layer: tuple[str, str] | None = None  # a layer kind's (attention, FFN) shape (kernels/spec.py)
    takes_tokens: bool = False  # its input is token ids (else the streams H)
    reads_context: bool = False  # it reads caches that grow with the context (`--context` sizes them)
    # a step of other kinds' launches (`model`): selected by name only (its parts are checked as their kinds)
    composite: bool = False
    bounds: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    knobs: tuple = ()  # its own knobs (tuning.knobs.Knob)
    runtime: tuple[str, ...] = ()  # the runtime's knobs it takes (tuning.knobs.RUNTIME_KNOBS)
    runtime_defaults: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    # "module:function" of what one rank's process runs with real ranks (kernels/runtime/ranks.py); None: the
    # kind runs on one device only (its peers emulated) so far
    ranks: str | None = None

    @property
    def has_kernels(self) -> bool:
        return self.harness is not None

    def load_harness(self):
        """The harness class: `Harness(weights, tp, rows, knobs, device, layer=None)` is one key's launch."""
        from glm53ctl.errors import UsageError

        if self.harness is None:
            raise UsageError(f"the Triton backend has no {self.name} launch yet", hint=f"kinds with kernels: {names()}")
        return _load(self.harness)

    def load_ranks(self):
        """What one rank runs with real ranks: `fn(group, model, tp, rows, inputs, knobs, mute, budget_ns)` -> per
        launch its outputs (a dict) or its fault in words (kernels/kinds/embed/ranks.py)."""
        from glm53ctl.errors import UsageError

        if self.ranks is None:
            real = ", ".join(ranks_kinds()) or "none"
            raise UsageError(f"{self.name} runs on one device only so far (its peers emulated)", hint=f"--gpus: {real}")
        return _load(self.ranks)

    def run_reference(self, ref, key):
        """`glm53ctl run`'s reference run of this kind (kernels/harness.py)."""
        return _load(self.reference_run)(ref, key)


def _load(path: str):
    module, name = path.split(":")
    return getattr(importlib.import_module(f"{_PKG}.{module}"), name)


def _facts(module) -> dict:
    """A kind folder's facts (its __init__.py) as registry fields."""
    return {
        "knobs": module.KNOBS,
        "runtime": module.RUNTIME,
        "runtime_defaults": MappingProxyType(module.RUNTIME_DEFAULTS),
        "bounds": MappingProxyType(module.BOUNDS),
    }


KINDS = {
    k.name: k
    for k in (
        Kind(
            "embed",
            "token ids -> H (vocab-parallel gather + all-reduce)",
            "harness:run_embed",
            "kinds.embed.harness:EmbedHarness",
            takes_tokens=True,
            ranks="kinds.embed.ranks:rank_launches",
            **_facts(embed),
        ),
        Kind(
            "dense",
            "one KDA layer with the dense MLP (layers 0-2)",
            "harness:run_layer",
            "kinds.dense.harness:DenseHarness",
            layer=("kda", "dense"),
            **_facts(dense),
        ),
        Kind(
            "kda",
            "one KDA layer with the MoE (router, 8 routed experts, the shared expert)",
            "harness:run_layer",
            "kinds.kda.harness:KdaHarness",
            layer=("kda", "moe"),
            **_facts(kda),
        ),
        Kind(
            "sparse",
            "one DSA layer with the MoE (MLA, the k-pool indexer and its top pools, the MoE)",
            "harness:run_layer",
            "kinds.sparse.harness:SparseHarness",
            layer=("dsa", "moe"),
            reads_context=True,
            **_facts(sparse),
        ),
        Kind(
            "tail",
            "mean of the streams, final norm, lm_head -> logits",
            "harness:run_tail",
            "kinds.tail.harness:TailHarness",
            ranks="kinds.tail.ranks:rank_launches",
            **_facts(tail),
        ),
        Kind(
            "model",
            "the whole decode step: embed, the layers in order, tail (each its kind's launch, chained)",
            "harness:run_model",
            "kinds.model.harness:ModelHarness",
            takes_tokens=True,
            reads_context=True,
            composite=True,
            **_facts(model),
        ),
    )
}


# The keys `check` and `fault` take on a CPU unless told otherwise (the full TP x rows matrix is --all-keys): every
# TP width and every row count once, so each kind meets no peers and peers (TP1 / TP>1), a norm folded into the
# GEMVs and not (rows <= 4 / 8), and 1, 2, 4 and 8 rows of its tiles; a quarter of the matrix's time.
CPU_KEYS = ((1, 1), (2, 8), (4, 2), (8, 4))


def names(with_kernels: bool = True) -> str:
    return ", ".join(n for n, k in KINDS.items() if k.has_kernels or not with_kernels)


def kernel_kinds() -> tuple[str, ...]:
    """The kinds that have kernels of their own, in registry order (what `check`, `fault`, `build`, `bench` and
    `tune` select by default)."""
    return tuple(n for n, k in KINDS.items() if k.has_kernels and not k.composite)


def selectable_kinds() -> tuple[str, ...]:
    """Every kind a command's --kind takes: those with kernels, and the steps made of them (`model`)."""
    return tuple(n for n, k in KINDS.items() if k.has_kernels)


def get_kind(name: str) -> Kind:
    from glm53ctl.errors import UsageError

    if name not in KINDS:
        raise UsageError(f"unknown kind {name!r}", hint=f"one of {names(with_kernels=False)}")
    return KINDS[name]


def ranks_kinds() -> tuple[str, ...]:
    """The kinds that run on real ranks, one process per rank (`--gpus T`): the default selection there."""
    return tuple(n for n, k in KINDS.items() if k.ranks)


def context_kinds() -> tuple[str, ...]:
    """The kinds whose launch reads caches that grow with the context: `--context` applies to them."""
    return tuple(n for n, k in KINDS.items() if k.reads_context)


LAYER_KINDS = {n: k.layer for n, k in KINDS.items() if k.layer is not None}

__all__ = ["CPU_KEYS", "KINDS", "LAYER_KINDS", "Kind", "get_kind", "kernel_kinds", "names"]
