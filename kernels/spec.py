"""The typed model spec, read from configs/models/<model>.toml, and its per-rank shard shapes (docs/model.md §1, §8).

Pure Python (no torch): the CLI reads it for `--help`-fast commands.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError

from glm53ctl.errors import ConfigError, UsageError
from glm53ctl.paths import config_roots, read_text, shipped_root

TP_WIDTHS = (1, 2, 4, 8)
ROWS = (1, 2, 4, 8)  # the row counts a command takes when none are given
ROW_COUNTS = tuple(range(1, 9))  # every row count the kernels run, each its own build key
LayerType = Literal["kda", "dsa"]
FfnType = Literal["dense", "moe"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ModelDims(_Section):
    hidden_size: PositiveInt
    vocab_size: PositiveInt
    num_layers: PositiveInt
    dsa_period: PositiveInt
    first_dense_layers: int = Field(ge=0)
    rms_norm_eps: float = Field(gt=0)
    # the positions the model was trained for: --context and the steps past it stay within them (unset: no bound)
    max_position_embeddings: PositiveInt | None = None


class MhcDims(_Section):
    streams: PositiveInt
    sinkhorn_iters: PositiveInt
    eps: float = Field(gt=0)


class KdaDims(_Section):
    heads: PositiveInt
    head_dim: PositiveInt
    conv_kernel: int = Field(ge=2)
    gate_lower_bound: float = Field(lt=0)
    gate_rank: PositiveInt


class MlaDims(_Section):
    heads: PositiveInt
    q_lora_rank: PositiveInt
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: Literal[0]  # GLM-5.3-Flash is NoPE; a rope part is not modelled
    v_head_dim: PositiveInt


class IndexerDims(_Section):
    heads: PositiveInt
    head_dim: PositiveInt
    topk: PositiveInt
    kpool: PositiveInt
    norm_eps: float = Field(gt=0)


class MoeDims(_Section):
    experts: PositiveInt
    top_k: PositiveInt
    shared_experts: Literal[1]
    intermediate_size: PositiveInt
    dense_intermediate_size: PositiveInt
    routed_scaling_factor: float = Field(gt=0)
    n_group: PositiveInt
    topk_group: PositiveInt
    swiglu_limit: float = Field(gt=0)


class ModelSpec(_Section):
    """One model's dimensions. Derived quantities are properties, so the file holds each fact once."""

    name: str
    description: str = ""
    model: ModelDims
    mhc: MhcDims
    kda: KdaDims
    mla: MlaDims
    indexer: IndexerDims
    moe: MoeDims

    def cross_check(self) -> list[tuple[str, str]]:
        """Facts that tie two keys together: (key path, what was expected)."""
        bad = []
        if self.indexer.topk % self.indexer.kpool:
            bad.append(("indexer.topk", f"must be a multiple of indexer.kpool ({self.indexer.kpool})"))
        if self.moe.top_k > self.moe.experts:
            bad.append(("moe.top_k", f"must not exceed moe.experts ({self.moe.experts})"))
        if self.moe.experts % self.moe.n_group:
            bad.append(("moe.n_group", f"must divide moe.experts ({self.moe.experts})"))
        if self.moe.topk_group > self.moe.n_group:
            bad.append(("moe.topk_group", f"must not exceed moe.n_group ({self.moe.n_group})"))
        if self.model.dsa_period < 2:
            bad.append(("model.dsa_period", "must be at least 2 (KDA layers between the DSA ones)"))
        return bad

    # ---- derived -------------------------------------------------------------------------

    @property
    def hidden(self) -> int:
        return self.model.hidden_size

    @property
    def kda_proj(self) -> int:
        """P = H * K: the width of each of q, k, v."""
        return self.kda.heads * self.kda.head_dim

    @property
    def index_pools(self) -> int:
        """Pools selected by the indexer (topk / kpool)."""
        return self.indexer.topk // self.indexer.kpool

    @property
    def index_width(self) -> int:
        """Selected token slots per row: top pools expanded, plus the tail (< kpool tokens)."""
        return self.indexer.topk + self.indexer.kpool - 1

    def layer_type(self, layer: int) -> LayerType:
        p = self.model.dsa_period
        return "dsa" if layer % p == p - 1 else "kda"

    def ffn_type(self, layer: int) -> FfnType:
        return "dense" if layer < self.model.first_dense_layers else "moe"

    @property
    def layers(self) -> tuple[tuple[LayerType, FfnType], ...]:
        return tuple((self.layer_type(i), self.ffn_type(i)) for i in range(self.model.num_layers))

    # ---- TP ------------------------------------------------------------------------------

    def sharded_dims(self) -> dict[str, int]:
        """Every dimension that TP splits (docs/model.md §8), by what it is."""
        return {
            "model.vocab_size": self.model.vocab_size,
            "kda.heads": self.kda.heads,
            "mla.heads": self.mla.heads,
            "moe.intermediate_size": self.moe.intermediate_size,
            "moe.dense_intermediate_size": self.moe.dense_intermediate_size,
        }

    def check_tp(self, tp: int) -> None:
        if tp not in TP_WIDTHS:
            raise UsageError(f"TP {tp} is not supported", hint=f"use one of {', '.join(map(str, TP_WIDTHS))}")
        bad = [f"{k} = {v}" for k, v in self.sharded_dims().items() if v % tp]
        if bad:
            raise UsageError(
                f"model {self.name!r} cannot be sharded at TP {tp}: {', '.join(bad)} not divisible by {tp}",
                hint="pick a TP that divides every sharded dimension",
            )

    def shards(self, tp: int) -> Shards:
        self.check_tp(tp)
        return Shards(self, tp)


@dataclass(frozen=True, slots=True)
class Shards:
    """Per-rank sizes and weight shapes at one TP width (docs/model.md §8). Shapes are (out, in) as stored."""

    spec: ModelSpec
    tp: int

    @property
    def vocab(self) -> int:
        return self.spec.model.vocab_size // self.tp

    @property
    def kda_heads(self) -> int:
        return self.spec.kda.heads // self.tp

    @property
    def kda_proj(self) -> int:
        return self.kda_heads * self.spec.kda.head_dim

    @property
    def mla_heads(self) -> int:
        return self.spec.mla.heads // self.tp

    @property
    def expert_inter(self) -> int:
        return self.spec.moe.intermediate_size // self.tp

    @property
    def dense_inter(self) -> int:
        return self.spec.moe.dense_intermediate_size // self.tp

    def weight_shapes(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Per part, the per-rank shape of every tensor (suffixes of the checkpoint names)."""
        s, D = self.spec, self.spec.hidden
        hc = s.mhc.streams
        K, r, W = s.kda.head_dim, s.kda.gate_rank, s.kda.conv_kernel
        P = self.kda_proj
        m, ix = s.mla, s.indexer
        Hm = self.mla_heads
        return {
            "embed": {"embed_tokens.weight": (self.vocab, D)},
            "gate": {
                "hc_fn": ((2 + hc) * hc, hc * D),
                "hc_base": ((2 + hc) * hc,),
                "hc_scale": (3,),
                "layernorm.weight": (D,),
            },
            "kda": {
                "q_proj.weight": (P, D),
                "k_proj.weight": (P, D),
                "v_proj.weight": (P, D),
                "b_proj.weight": (self.kda_heads, D),
                "f_a_proj.weight": (r, D),
                "f_b_proj.weight": (P, r),
                "g_a_proj.weight": (r, D),
                "g_b_proj.weight": (P, r),
                "q_conv1d.weight": (P, 1, W),
                "k_conv1d.weight": (P, 1, W),
                "v_conv1d.weight": (P, 1, W),
                "A_log": (self.kda_heads,),
                "dt_bias": (P,),
                "o_norm.weight": (K,),
                "o_proj.weight": (D, P),
            },
            "dsa": {
                "q_a_proj.weight": (m.q_lora_rank, D),
                "q_a_layernorm.weight": (m.q_lora_rank,),
                "kv_a_proj_with_mqa.weight": (m.kv_lora_rank, D),
                "kv_a_layernorm.weight": (m.kv_lora_rank,),
                "q_b_proj.weight": (Hm * m.qk_nope_head_dim, m.q_lora_rank),
                "kv_b_proj.weight": (Hm * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
                "o_proj.weight": (D, Hm * m.v_head_dim),
                "indexer.wq_b.weight": (ix.heads * ix.head_dim, m.q_lora_rank),
                "indexer.wk.weight": (ix.head_dim, D),
                "indexer.k_norm.weight": (ix.head_dim,),
                "indexer.k_norm.bias": (ix.head_dim,),
                "indexer.weights_proj.weight": (ix.heads, D),
                "indexer.index_kpool_compress_gate.weight": (ix.head_dim, D),
                "indexer.index_kpool_compress_ape": (ix.kpool, ix.head_dim),
            },
            "dense": {
                "gate_proj.weight": (self.dense_inter, D),
                "up_proj.weight": (self.dense_inter, D),
                "down_proj.weight": (D, self.dense_inter),
            },
            "moe": {
                "gate.weight": (s.moe.experts, D),
                "gate.e_score_correction_bias": (s.moe.experts,),
                "experts.gate_proj.weight": (s.moe.experts, self.expert_inter, D),
                "experts.up_proj.weight": (s.moe.experts, self.expert_inter, D),
                "experts.down_proj.weight": (s.moe.experts, D, self.expert_inter),
                "shared_experts.gate_proj.weight": (self.expert_inter, D),
                "shared_experts.up_proj.weight": (self.expert_inter, D),
                "shared_experts.down_proj.weight": (D, self.expert_inter),
            },
            "tail": {"norm.weight": (D,), "lm_head.weight": (self.vocab, D)},
        }

    def state_shapes(self, rows: int, max_context: int) -> dict[str, tuple[int, ...]]:
        """Per-layer decode state of one rank (docs/model.md §4, §5): KDA states per rank, DSA caches replicated."""
        s = self.spec
        P, K = self.kda_proj, s.kda.head_dim
        ix = s.indexer
        return {
            "kda.conv": (rows, s.kda.conv_kernel - 1, 3 * P),
            "kda.recurrent": (rows, self.kda_heads, K, K),
            "dsa.latent": (rows, max_context, s.mla.kv_lora_rank),
            "dsa.index_key": (rows, max_context, ix.head_dim),
            "dsa.index_gate": (rows, max_context, ix.head_dim),
            "dsa.pooled_key": (rows, max_context // ix.kpool, ix.head_dim),
        }


# ---- loading ---------------------------------------------------------------------------------


def models_dir() -> Path:
    """The shipped models folder."""

    return shipped_root() / "models"


# the model files loaded by path in this process (and its parent's, which its workers inherit): a name that a
# command got as a path resolves to that file wherever the command's keys go next
MODEL_FILES_ENV = "GLM53CTL_MODEL_FILES"


def model_files() -> dict[str, Path]:
    """Model name -> file; the files loaded by path first, then $GLM53CTL_CONFIG_DIR/models, then the shipped
    ones."""

    found: dict[str, Path] = {}
    for p in filter(None, os.environ.get(MODEL_FILES_ENV, "").split(os.pathsep)):
        found.setdefault(Path(p).stem, Path(p))
    for root in config_roots():
        for p in sorted((root / "models").glob("*.toml")):
            found.setdefault(p.stem, p)
    return dict(sorted(found.items()))


def model_names() -> list[str]:
    return list(model_files())


def format_validation_error(path: Path | str, err: ValidationError) -> str:
    """`file: key.path: what was expected`, one line per problem."""
    lines = []
    seen = set()
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if loc in seen:
            continue
        seen.add(loc)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{path}: {loc}: {msg}")
    return "\n".join(lines)


def load_model_file(path: Path) -> ModelSpec:

    try:
        doc = tomllib.loads(read_text(path))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    try:
        spec = ModelSpec.model_validate(doc)
    except ValidationError as e:
        raise ConfigError(format_validation_error(path, e), hint="compare with configs/models/tiny.toml") from None
    bad = spec.cross_check()
    if bad:
        raise ConfigError("\n".join(f"{path}: {loc}: {msg}" for loc, msg in bad))
    if spec.name != path.stem:
        raise ConfigError(f"{path}: name: {spec.name!r} does not match the file name {path.stem!r}")
    return spec


def load_model(name: str) -> ModelSpec:
    """A model by name (`tiny`, `glm53_flash`) or by the path of a .toml file."""
    path = Path(name)
    if path.suffix == ".toml":
        spec = load_model_file(path)
        known = os.environ.get(MODEL_FILES_ENV, "").split(os.pathsep)
        if str(path.resolve()) not in known:  # `spec.name` finds this file from now on, in workers too
            os.environ[MODEL_FILES_ENV] = os.pathsep.join(filter(None, [*known, str(path.resolve())]))
        return spec
    files = model_files()
    if name not in files:
        raise UsageError(f"unknown model {name!r}", hint=f"known models: {', '.join(files) or '(none found)'}")
    return load_model_file(files[name])
