"""The registry of launch kinds: what every command reads to know a kind (docs/design.md §2).

One entry per kind (`Kind`, kernels/kinds/base.py): what it computes, its reference run (what `glm53ctl run`
saves), the layer shape it runs (for layer kinds), its launch harness (its kernel, launch, table and reference
outputs at a key; None until the kind has kernels), its accuracy bounds, and its knobs (its own, and the runtime's
it takes, with its own defaults). How a kind's knobs become compile-time constants is its launch's `constexprs()`.

Adding a kind is a folder `kernels/kinds/<kind>/` (facts in `__init__.py`: KNOBS, RUNTIME, RUNTIME_DEFAULTS,
BOUNDS; then `table.py`, `kernel.py`, `launch.py`, `harness.py`) and one line below: its `Kind`, whose harness,
reference and ranks are loaders (small functions below, each importing what it returns). A kind from outside the
tree (a test's, a plugin's) is one module holding `KIND = Kind(...)`, named in $GLM53CTL_KINDS (comma-separated
module names): every process that imports the registry loads it, so the worker processes of `check`, `fault`
and `build`, which inherit the environment, know it too. Nothing outside this module asks `if kind == ...`.
Importing it costs no torch: harnesses and references load when first used.
"""

from __future__ import annotations

import importlib
import os

from glm53ctl.errors import ConfigError, UsageError
from glm53ctl.kernels.kinds import dense, embed, kda, model, sparse, tail
from glm53ctl.kernels.kinds.base import Kind, facts

# modules, comma-separated, each holding `KIND = Kind(...)`: kinds from outside the tree (module doc)
ENV_KINDS = "GLM53CTL_KINDS"


IN_TREE = (
    Kind(
        "embed",
        "token ids -> H (vocab-parallel gather + all-reduce)",
        "glm53ctl.kernels.kinds.harness:run_embed",
        "glm53ctl.kernels.kinds.embed.harness:EmbedHarness",
        takes_tokens=True,
        ranks="glm53ctl.kernels.kinds.embed.ranks:rank_launches",
        colour="#8c8c8c",
        **facts(embed),
    ),
    Kind(
        "dense",
        "one KDA layer with the dense MLP (layers 0-2)",
        "glm53ctl.kernels.kinds.harness:run_layer",
        "glm53ctl.kernels.kinds.dense.harness:DenseHarness",
        ranks="glm53ctl.kernels.kinds.dense.ranks:rank_launches",
        colour="#4c72b0",
        **facts(dense),
    ),
    Kind(
        "kda",
        "one KDA layer with the MoE (router, 8 routed experts, the shared expert)",
        "glm53ctl.kernels.kinds.harness:run_layer",
        "glm53ctl.kernels.kinds.kda.harness:KdaHarness",
        ranks="glm53ctl.kernels.kinds.dense.ranks:rank_launches",
        colour="#55a868",
        **facts(kda),
    ),
    Kind(
        "sparse",
        "one DSA layer with the MoE (MLA, the k-pool indexer and its top pools, the MoE)",
        "glm53ctl.kernels.kinds.harness:run_layer",
        "glm53ctl.kernels.kinds.sparse.harness:SparseHarness",
        reads_context=True,
        ranks="glm53ctl.kernels.kinds.sparse.ranks:rank_launches",
        colour="#c44e52",
        **facts(sparse),
    ),
    Kind(
        "tail",
        "mean of the streams, final norm, lm_head -> logits",
        "glm53ctl.kernels.kinds.harness:run_tail",
        "glm53ctl.kernels.kinds.tail.harness:TailHarness",
        ranks="glm53ctl.kernels.kinds.tail.ranks:rank_launches",
        colour="#8172b2",
        **facts(tail),
    ),
    Kind(
        "model",
        "the whole decode step: embed, the layers in order, tail (each its kind's launch, chained)",
        "glm53ctl.kernels.kinds.harness:run_model",
        "glm53ctl.kernels.kinds.model.harness:ModelHarness",
        takes_tokens=True,
        reads_context=True,
        composite=True,
        parts=("embed", "dense", "kda", "sparse", "tail"),
        ranks="glm53ctl.kernels.kinds.model.ranks:rank_launches",
        **facts(model),
    ),
)


def _extra_kinds() -> tuple[Kind, ...]:
    """The kinds of the modules $GLM53CTL_KINDS names (module doc)."""

    out = []
    for name in (n.strip() for n in os.environ.get(ENV_KINDS, "").split(",") if n.strip()):
        try:
            kind = importlib.import_module(name).KIND
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"{ENV_KINDS}: {name}: {e}", hint="a module holding KIND = Kind(...)") from None
        if not isinstance(kind, Kind):
            raise ConfigError(f"{ENV_KINDS}: {name}.KIND is not a Kind")
        out.append(kind)
    return tuple(out)


def _registry() -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    for k in IN_TREE + _extra_kinds():
        if k.name in kinds:
            raise ConfigError(f"{ENV_KINDS}: kind {k.name!r} is already registered")
        kinds[k.name] = k
    return kinds


KINDS = _registry()


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

    if name not in KINDS:
        raise UsageError(f"unknown kind {name!r}", hint=f"one of {names(with_kernels=False)}")
    return KINDS[name]


def load_harness(name: str):
    """The harness class of a kind (`Harness(weights, key)` is one key's launch: kernels/kinds/harness.py)."""

    kind = get_kind(name)
    if kind.harness is None:
        raise UsageError(f"the Triton backend has no {name} launch yet", hint=f"kinds with kernels: {names()}")
    return kind.load_harness()


def load_ranks(name: str):
    """What one rank runs with real ranks: `fn(group, key, inputs, mute, budget_ns)` -> per launch its outputs (a
    dict) or its fault in words (kernels/kinds/embed/ranks.py)."""

    kind = get_kind(name)
    if kind.ranks is None:
        real = ", ".join(ranks_kinds()) or "none"
        raise UsageError(f"{name} runs on one device only so far (its peers emulated)", hint=f"--gpus: {real}")
    return kind.load_ranks()


def ranks_kinds() -> tuple[str, ...]:
    """The kinds that run on real ranks, one process per rank (`--gpus T`): the default selection there."""
    return tuple(n for n, k in KINDS.items() if k.ranks)


def context_kinds() -> tuple[str, ...]:
    """The kinds whose launch reads caches that grow with the context: `--context` applies to them."""
    return tuple(n for n, k in KINDS.items() if k.reads_context)


LAYER_KINDS = {n: k.layer for n, k in KINDS.items() if k.layer is not None}

__all__ = ["CPU_KEYS", "KINDS", "LAYER_KINDS", "Kind", "get_kind", "kernel_kinds", "load_harness", "names"]
