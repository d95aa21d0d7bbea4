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

from glm53ctl.kernels.kinds import dense, embed, kda, model, sparse, tail
from glm53ctl.kernels.kinds.base import Kind, facts

# modules, comma-separated, each holding `KIND = Kind(...)`: kinds from outside the tree (module doc)
ENV_KINDS = "GLM53CTL_KINDS"


def _embed_harness():
    from glm53ctl.kernels.kinds.embed.harness import EmbedHarness

    return EmbedHarness


def _dense_harness():
    from glm53ctl.kernels.kinds.dense.harness import DenseHarness

    return DenseHarness


def _kda_harness():
    from glm53ctl.kernels.kinds.kda.harness import KdaHarness

    return KdaHarness


def _sparse_harness():
    from glm53ctl.kernels.kinds.sparse.harness import SparseHarness

    return SparseHarness


def _tail_harness():
    from glm53ctl.kernels.kinds.tail.harness import TailHarness

    return TailHarness


def _model_harness():
    from glm53ctl.kernels.kinds.model.harness import ModelHarness

    return ModelHarness


def _embed_reference():
    from glm53ctl.kernels.harness import run_embed

    return run_embed


def _layer_reference():
    from glm53ctl.kernels.harness import run_layer

    return run_layer


def _tail_reference():
    from glm53ctl.kernels.harness import run_tail

    return run_tail


def _model_reference():
    from glm53ctl.kernels.harness import run_model

    return run_model


def _embed_ranks():
    from glm53ctl.kernels.kinds.embed.ranks import rank_launches

    return rank_launches


def _layer_ranks():
    from glm53ctl.kernels.kinds.dense.ranks import rank_launches

    return rank_launches


def _sparse_ranks():
    from glm53ctl.kernels.kinds.sparse.ranks import rank_launches

    return rank_launches


def _tail_ranks():
    from glm53ctl.kernels.kinds.tail.ranks import rank_launches

    return rank_launches


def _model_ranks():
    from glm53ctl.kernels.kinds.model.ranks import rank_launches

    return rank_launches


IN_TREE = (
    Kind(
        "embed",
        "token ids -> H (vocab-parallel gather + all-reduce)",
        _embed_reference,
        _embed_harness,
        takes_tokens=True,
        ranks=_embed_ranks,
        colour="#8c8c8c",
        **facts(embed),
    ),
    Kind(
        "dense",
        "one KDA layer with the dense MLP (layers 0-2)",
        _layer_reference,
        _dense_harness,
        layer=("kda", "dense"),
        ranks=_layer_ranks,
        colour="#4c72b0",
        **facts(dense),
    ),
    Kind(
        "kda",
        "one KDA layer with the MoE (router, 8 routed experts, the shared expert)",
        _layer_reference,
        _kda_harness,
        layer=("kda", "moe"),
        ranks=_layer_ranks,
        colour="#55a868",
        **facts(kda),
    ),
    Kind(
        "sparse",
        "one DSA layer with the MoE (MLA, the k-pool indexer and its top pools, the MoE)",
        _layer_reference,
        _sparse_harness,
        layer=("dsa", "moe"),
        reads_context=True,
        ranks=_sparse_ranks,
        colour="#c44e52",
        **facts(sparse),
    ),
    Kind(
        "tail",
        "mean of the streams, final norm, lm_head -> logits",
        _tail_reference,
        _tail_harness,
        ranks=_tail_ranks,
        colour="#8172b2",
        **facts(tail),
    ),
    Kind(
        "model",
        "the whole decode step: embed, the layers in order, tail (each its kind's launch, chained)",
        _model_reference,
        _model_harness,
        takes_tokens=True,
        reads_context=True,
        composite=True,
        parts=("embed", "dense", "kda", "sparse", "tail"),
        ranks=_model_ranks,
        **facts(model),
    ),
)


def _extra_kinds() -> tuple[Kind, ...]:
    """The kinds of the modules $GLM53CTL_KINDS names (module doc)."""
    from glm53ctl.errors import ConfigError

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
            from glm53ctl.errors import ConfigError

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
    from glm53ctl.errors import UsageError

    if name not in KINDS:
        raise UsageError(f"unknown kind {name!r}", hint=f"one of {names(with_kernels=False)}")
    return KINDS[name]


def load_harness(name: str):
    """The harness class of a kind (`Harness(weights, key)` is one key's launch: kernels/harness.py)."""
    from glm53ctl.errors import UsageError

    kind = get_kind(name)
    if kind.harness is None:
        raise UsageError(f"the Triton backend has no {name} launch yet", hint=f"kinds with kernels: {names()}")
    return kind.harness()


def load_ranks(name: str):
    """What one rank runs with real ranks: `fn(group, key, inputs, mute, budget_ns)` -> per launch its outputs (a
    dict) or its fault in words (kernels/kinds/embed/ranks.py)."""
    from glm53ctl.errors import UsageError

    kind = get_kind(name)
    if kind.ranks is None:
        real = ", ".join(ranks_kinds()) or "none"
        raise UsageError(f"{name} runs on one device only so far (its peers emulated)", hint=f"--gpus: {real}")
    return kind.ranks()


def run_reference(ref, key):
    """`glm53ctl run`'s reference run of the key's kind (kernels/harness.py): inputs.*, outputs.*, writes.*."""
    from glm53ctl.kernels.run_key import check_run_key

    check_run_key(key)
    return get_kind(key.kind).reference()(ref, key)


def run_triton(weights, key, resolved):
    """`glm53ctl run --backend triton`: the saved tensors of run_reference's layout, the launch at `resolved`."""
    from glm53ctl.kernels.run_key import check_run_key

    check_run_key(key)
    return load_harness(key.kind).run(weights, key, resolved)


def ranks_kinds() -> tuple[str, ...]:
    """The kinds that run on real ranks, one process per rank (`--gpus T`): the default selection there."""
    return tuple(n for n, k in KINDS.items() if k.ranks)


def context_kinds() -> tuple[str, ...]:
    """The kinds whose launch reads caches that grow with the context: `--context` applies to them."""
    return tuple(n for n, k in KINDS.items() if k.reads_context)


LAYER_KINDS = {n: k.layer for n, k in KINDS.items() if k.layer is not None}

__all__ = ["CPU_KEYS", "KINDS", "LAYER_KINDS", "Kind", "get_kind", "kernel_kinds", "load_harness", "names"]
