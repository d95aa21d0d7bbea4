"""Model weights: seeded random (identical on any machine), sharded per rank (docs/model.md §8), safetensors I/O.

Tensors are made lazily by checkpoint name, so one layer of glm53_flash, or only the routed experts,
costs only what it touches. A tensor is generated in blocks of rows, each seeded from (seed, name,
block), so a rank's row shard is generated without the rest and equals the same rows of the full tensor.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from glm53ctl.errors import ConfigError, UsageError
from glm53ctl.kernels.spec import ModelSpec

# the H200's L2 as docs/design.md §8 gives it; torch.cuda.get_device_properties(d).L2_cache_size reports a device's own
# (what bench's rotations and a timed step's weight sharing stream past)
L2_BYTES = 60 * 2**20

ROOT = "model.language_model."
BLOCK_ROWS = 1024
FP32 = torch.float32
BF16 = torch.bfloat16


@dataclass(frozen=True, slots=True)
class TensorInfo:
    shape: tuple[int, ...]  # full (TP1) shape
    dtype: torch.dtype
    std: float  # random init scale: keeps activations realistic through all layers
    mean: float = 0.0
    split: int | None = None  # dim TP splits (0 rows, 1 columns), None = replicated
    kind: str = "normal"  # normal | log_uniform (A_log)


def _layer_tensors(spec: ModelSpec, i: int) -> dict[str, TensorInfo]:
    D, hc = spec.hidden, spec.mhc.streams
    t: dict[str, TensorInfo] = {}
    for site, norm in (("attn", "input_layernorm"), ("ffn", "post_attention_layernorm")):
        n = (2 + hc) * hc
        t[f"hc_{site}_fn"] = TensorInfo((n, hc * D), FP32, 0.5 / math.sqrt(hc * D))
        t[f"hc_{site}_base"] = TensorInfo((n,), FP32, 0.3)
        t[f"hc_{site}_scale"] = TensorInfo((3,), FP32, 0.1, mean=1.0)
        t[f"{norm}.weight"] = TensorInfo((D,), BF16, 0.1, mean=1.0)
    a = "self_attn."
    if spec.layer_type(i) == "kda":
        k = spec.kda
        P, r, W = spec.kda_proj, k.gate_rank, k.conv_kernel
        for p in ("q", "k", "v"):
            t[f"{a}{p}_proj.weight"] = TensorInfo((P, D), BF16, 1 / math.sqrt(D), split=0)
            t[f"{a}{p}_conv1d.weight"] = TensorInfo((P, 1, W), FP32, 0.5, split=0)
        t[f"{a}b_proj.weight"] = TensorInfo((k.heads, D), BF16, 1 / math.sqrt(D), split=0)
        for g in ("f", "g"):
            t[f"{a}{g}_a_proj.weight"] = TensorInfo((r, D), BF16, 1 / math.sqrt(D))
            t[f"{a}{g}_b_proj.weight"] = TensorInfo((P, r), BF16, 1 / math.sqrt(r), split=0)
        t[f"{a}A_log"] = TensorInfo((k.heads,), FP32, 0.0, split=0, kind="log_uniform")
        t[f"{a}dt_bias"] = TensorInfo((P,), FP32, 0.5, split=0)
        t[f"{a}o_norm.weight"] = TensorInfo((k.head_dim,), BF16, 0.1, mean=1.0)
        t[f"{a}o_proj.weight"] = TensorInfo((D, P), BF16, 1 / math.sqrt(P), split=1)
    else:
        m, ix = spec.mla, spec.indexer
        H = m.heads
        t[f"{a}q_a_proj.weight"] = TensorInfo((m.q_lora_rank, D), BF16, 1 / math.sqrt(D))
        t[f"{a}q_a_layernorm.weight"] = TensorInfo((m.q_lora_rank,), BF16, 0.1, mean=1.0)
        t[f"{a}kv_a_proj_with_mqa.weight"] = TensorInfo((m.kv_lora_rank, D), BF16, 1 / math.sqrt(D))
        t[f"{a}kv_a_layernorm.weight"] = TensorInfo((m.kv_lora_rank,), BF16, 0.1, mean=1.0)
        qk = m.qk_nope_head_dim
        t[f"{a}q_b_proj.weight"] = TensorInfo((H * qk, m.q_lora_rank), BF16, 1 / math.sqrt(m.q_lora_rank), split=0)
        t[f"{a}kv_b_proj.weight"] = TensorInfo(
            (H * (qk + m.v_head_dim), m.kv_lora_rank), BF16, 1 / math.sqrt(m.kv_lora_rank), split=0
        )
        t[f"{a}o_proj.weight"] = TensorInfo((D, H * m.v_head_dim), BF16, 1 / math.sqrt(H * m.v_head_dim), split=1)
        ia = f"{a}indexer."
        t[f"{ia}wq_b.weight"] = TensorInfo((ix.heads * ix.head_dim, m.q_lora_rank), BF16, 1 / math.sqrt(m.q_lora_rank))
        t[f"{ia}wk.weight"] = TensorInfo((ix.head_dim, D), BF16, 1 / math.sqrt(D))
        t[f"{ia}k_norm.weight"] = TensorInfo((ix.head_dim,), BF16, 0.1, mean=1.0)
        t[f"{ia}k_norm.bias"] = TensorInfo((ix.head_dim,), BF16, 0.1)
        t[f"{ia}weights_proj.weight"] = TensorInfo((ix.heads, D), BF16, 1 / math.sqrt(D))
        t[f"{ia}index_kpool_compress_gate.weight"] = TensorInfo((ix.head_dim, D), BF16, 1 / math.sqrt(D))
        t[f"{ia}index_kpool_compress_ape"] = TensorInfo((ix.kpool, ix.head_dim), FP32, 0.5)
    f = "mlp."
    if spec.ffn_type(i) == "dense":
        I = spec.moe.dense_intermediate_size
        _mlp(t, f, I, D)
    else:
        E, I = spec.moe.experts, spec.moe.intermediate_size
        t[f"{f}gate.weight"] = TensorInfo((E, D), BF16, 1 / math.sqrt(D))
        t[f"{f}gate.e_score_correction_bias"] = TensorInfo((E,), FP32, 0.05)
        for e in range(E):
            _mlp(t, f"{f}experts.{e}.", I, D)
        _mlp(t, f"{f}shared_experts.", I, D)
    return {f"{ROOT}layers.{i}.{k}": v for k, v in t.items()}


def _mlp(t: dict[str, TensorInfo], prefix: str, inter: int, D: int) -> None:
    t[f"{prefix}gate_proj.weight"] = TensorInfo((inter, D), BF16, 1 / math.sqrt(D), split=0)
    t[f"{prefix}up_proj.weight"] = TensorInfo((inter, D), BF16, 1 / math.sqrt(D), split=0)
    t[f"{prefix}down_proj.weight"] = TensorInfo((D, inter), BF16, 1 / math.sqrt(inter), split=1)


def tensor_table(spec: ModelSpec) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint (docs/model.md §3–§7 names), with its full shape, dtype and init."""
    D, V = spec.hidden, spec.model.vocab_size
    t = {f"{ROOT}embed_tokens.weight": TensorInfo((V, D), BF16, 1.0, split=0)}
    for i in range(spec.model.num_layers):
        t.update(_layer_tensors(spec, i))
    t[f"{ROOT}norm.weight"] = TensorInfo((D,), BF16, 0.1, mean=1.0)
    t["lm_head.weight"] = TensorInfo((V, D), BF16, 1 / math.sqrt(D), split=0)
    return t


def _seed(seed: int, name: str, block: int) -> int:
    h = hashlib.sha256(f"{seed}/{name}/{block}".encode()).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _generate(seed: int, name: str, info: TensorInfo, rows: range, device: str = "cpu") -> torch.Tensor:
    """Rows `rows` of the full tensor (dim 0), block by block, drawn on `device` (CPU and CUDA draw
    different numbers, each the same on every machine of its kind)."""
    tail = info.shape[1:]
    parts = []
    for b in range(rows.start // BLOCK_ROWS, (rows.stop - 1) // BLOCK_ROWS + 1):
        lo, hi = b * BLOCK_ROWS, min((b + 1) * BLOCK_ROWS, info.shape[0])
        g = torch.Generator(device=device).manual_seed(_seed(seed, name, b))
        if info.kind == "log_uniform":  # A_log: exp(A) spread over [1, 16]
            x = torch.rand((hi - lo, *tail), generator=g, device=device) * math.log(16.0)
        else:
            x = torch.randn((hi - lo, *tail), generator=g, device=device) * info.std + info.mean
        parts.append(x[max(rows.start, lo) - lo : min(rows.stop, hi) - lo])
    return torch.cat(parts).to(info.dtype)


@dataclass
class Weights:
    """The checkpoint of one model: seeded random tensors, or tensors loaded from a file (overrides)."""

    spec: ModelSpec
    seed: int = 0
    loaded: dict[str, torch.Tensor] = field(default_factory=dict)
    source: Path | None = None  # a file: every tensor used must come from it
    device: str = "cpu"  # where random tensors are drawn (a GPU draws glm53_flash's in seconds)
    checkpoint: Checkpoint | None = None  # a Hugging Face checkpoint folder: each rank's slice read from it
    touched: set[str] = field(default_factory=set)
    # layer -> the layer of the same shape whose tensors it reads (`share_layers`: a step too big for one GPU)
    alias: dict[int, int] = field(default_factory=dict)
    _cache: dict[tuple[str, int, int], torch.Tensor] = field(default_factory=dict, repr=False)
    _prepared: dict[tuple, dict] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.table = tensor_table(self.spec)

    def share_layers(self, sets: int) -> Weights:
        """These weights with the layers of each shape (dense, kda, sparse) reading `sets` distinct layers' tensors
        in turn: layer i reads the tensors of the (k mod sets)-th layer of its shape, k its place among them. What
        a whole step times below TP8, where the per-rank weights of every layer do not fit one GPU; the layers
        that share also share their prepared (kernel-layout) weights (`prepared`)."""
        by_shape: dict[tuple, list[int]] = {}
        for i, shape in enumerate(self.spec.layers):
            by_shape.setdefault(shape, []).append(i)
        alias = {i: same[k % sets] for same in by_shape.values() for k, i in enumerate(same)}
        return Weights(self.spec, self.seed, self.loaded, self.source, self.device, self.checkpoint, alias=alias)

    def source_layer(self, i: int) -> int:
        """The layer whose tensors layer i reads (itself unless shared)."""
        return self.alias.get(i, i)

    def prepared(self, key: tuple, make) -> dict:
        """A layer's weights in a kernel's layout, made once per (source layer, ...) `key` where layers share
        (`share_layers`); else made each time (a key's harness holds its own)."""
        if not self.alias:
            return make()
        if key not in self._prepared:
            self._prepared[key] = make()
        return self._prepared[key]

    def drop_raw(self) -> None:
        """Forget the checkpoint-layout tensors made so far (they come back on demand): a timed step keeps only
        its prepared weights."""
        self._cache.clear()

    def info(self, name: str) -> TensorInfo:
        try:
            return self.table[name]
        except KeyError:
            raise ConfigError(f"no tensor {name!r} in model {self.spec.name!r}") from None

    def shard(self, name: str, rank: int = 0, tp: int = 1) -> torch.Tensor:
        """Rank `rank`'s shard of tensor `name` at TP `tp` (the whole tensor if replicated)."""
        info = self.info(name)
        self.touched.add(name)
        if self.alias and name.startswith(f"{ROOT}layers."):
            i, rest = name[len(f"{ROOT}layers.") :].split(".", 1)
            name = f"{ROOT}layers.{self.source_layer(int(i))}.{rest}"
        split = info.split if tp > 1 else None
        key = (name, rank if split is not None else 0, tp if split is not None else 1)
        if key in self._cache:
            return self._cache[key]
        if self.checkpoint is not None:
            out = self.checkpoint.read(name, info, rank, tp, split)
        elif self.source is not None and name not in self.loaded:
            raise ConfigError(f"{self.source}: missing tensor {name!r}", hint="the run needs it; add it to the file")
        elif name in self.loaded:
            full = self.loaded[name]
            out = full if split is None else full.chunk(tp, dim=split)[rank].contiguous()
        elif split == 0:
            n = info.shape[0] // tp
            out = _generate(self.seed, name, info, range(rank * n, (rank + 1) * n), self.device)
        else:
            out = _generate(self.seed, name, info, range(info.shape[0]), self.device)
            if split == 1:
                out = out.chunk(tp, dim=1)[rank].contiguous()
        self._cache[key] = out
        return out

    def part(self, prefix: str, rank: int = 0, tp: int = 1) -> PartView:
        """A lazy mapping of suffix -> this rank's shard, for every tensor under `prefix`."""
        return PartView(self, prefix, rank, tp)

    def layer(self, i: int, rank: int = 0, tp: int = 1) -> PartView:
        return self.part(f"{ROOT}layers.{i}.", rank, tp)


@dataclass(frozen=True)
class PartView(Mapping[str, torch.Tensor]):
    weights: Weights
    prefix: str
    rank: int
    tp: int

    def __getitem__(self, suffix: str) -> torch.Tensor:
        return self.weights.shard(self.prefix + suffix, self.rank, self.tp)

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self.weights.table if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def sub(self, prefix: str) -> PartView:
        return PartView(self.weights, self.prefix + prefix, self.rank, self.tp)


# ---- safetensors ---------------------------------------------------------------------------


def save_weights(path: Path, weights: Weights, names: list[str] | None = None) -> None:
    """Full (TP1) tensors under their checkpoint names and dtypes (default: those used so far)."""
    from safetensors.torch import save_file

    names = sorted(names if names is not None else weights.touched)
    save_file({n: weights.shard(n).contiguous() for n in names}, str(path), metadata={"model": weights.spec.name})


SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "F64": torch.float64}
INDEX = "model.safetensors.index.json"


class Checkpoint:
    """A checkpoint in the Hugging Face layout: a folder of safetensors shards and `model.safetensors.index.json`
    (its `weight_map`: tensor name -> file; without an index, every *.safetensors file in the folder). Tensors
    keep the checkpoint's names; a rank reads only its slice of each (safetensors' lazy slices), on first use."""

    def __init__(self, folder: Path, spec: ModelSpec) -> None:
        import json

        from safetensors import SafetensorError, safe_open

        self.folder, self.spec = Path(folder), spec
        index = self.folder / INDEX
        try:
            if index.exists():
                try:
                    wmap = json.loads(index.read_text())["weight_map"]
                except (ValueError, KeyError, TypeError) as e:
                    raise ConfigError(f"{index}: not a safetensors index (no weight_map): {e}") from None
                if not isinstance(wmap, dict) or not all(isinstance(f, str) for f in wmap.values()):
                    raise ConfigError(f"{index}: weight_map must map tensor names to file names")
                self.weight_map = {n: self.folder / f for n, f in wmap.items()}
            else:
                files = sorted(self.folder.glob("*.safetensors"))
                if not files:
                    raise UsageError(f"{folder}: no {INDEX} and no *.safetensors file in it")
                self.weight_map = {}
                for f in files:
                    with safe_open(str(f), framework="pt") as h:
                        for name in h.keys():
                            if name in self.weight_map:
                                raise ConfigError(
                                    f"{folder}: tensor {name!r} in both {self.weight_map[name].name} and {f.name}"
                                )
                            self.weight_map[name] = f
        except (SafetensorError, OSError) as e:
            raise ConfigError(f"{folder}: not a safetensors checkpoint: {e}") from None
        self._open: dict[Path, object] = {}

    def _slice(self, name: str):
        from safetensors import SafetensorError, safe_open

        f = self.weight_map.get(name)
        if f is None:
            raise ConfigError(f"{self.folder}: missing tensor {name!r} (the checkpoint's index names no file for it)")
        if f not in self._open:
            try:
                self._open[f] = safe_open(str(f), framework="pt")
            except (SafetensorError, OSError) as e:
                raise ConfigError(f"{f}: cannot read it for {name!r}: {e}") from None
        try:
            return self._open[f].get_slice(name)
        except SafetensorError:
            raise ConfigError(f"{f}: missing tensor {name!r} (the index names this file)") from None

    def check(self, table: dict[str, TensorInfo]) -> None:
        """Every tensor the model needs, present with its shape and dtype (headers only: nothing is read)."""
        for name, info in table.items():
            sl = self._slice(name)
            shape, dtype = tuple(sl.get_shape()), SAFETENSORS_DTYPES.get(sl.get_dtype(), sl.get_dtype())
            if shape != info.shape or dtype != info.dtype:
                raise ConfigError(
                    f"{self.weight_map[name]}: tensor {name!r} is {shape} {dtype}, expected {info.shape} {info.dtype}"
                )

    def read(self, name: str, info: TensorInfo, rank: int, tp: int, split: int | None) -> torch.Tensor:
        """Rank's slice of one tensor (the whole of a replicated one)."""
        sl = self._slice(name)
        if split is None:
            t = sl[:]
        else:
            n = info.shape[split] // tp
            t = sl[rank * n : (rank + 1) * n] if split == 0 else sl[:, rank * n : (rank + 1) * n]
        return t.contiguous().clone()


def load_weights(path: Path, spec: ModelSpec, partial: bool = False) -> Weights:
    """Tensors from a safetensors file, or a checkpoint folder in the Hugging Face layout (`Checkpoint`); every
    tensor must have its checkpoint shape and dtype.

    partial=True lets a file hold a subset (e.g. one layer): a run that needs a tensor the file lacks fails naming
    it. A folder is a whole checkpoint: every tensor the model needs is checked first (names, shapes, dtypes).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not Path(path).exists():
        raise UsageError(f"{path}: no such weights file or checkpoint folder")
    if Path(path).is_dir():
        ckpt = Checkpoint(Path(path), spec)
        ckpt.check(tensor_table(spec))
        return Weights(spec, source=Path(path), checkpoint=ckpt)
    try:
        # cloned: mapped tensors can sit at unaligned addresses, where CPU kernels sum in another
        # order, and a reloaded checkpoint must give the same bits as the one saved
        tensors = {k: v.clone() for k, v in load_file(str(path)).items()}
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"{path}: not a safetensors file: {e}") from None
    table = tensor_table(spec)
    for name, t in tensors.items():
        info = table.get(name)
        if info is None:
            raise ConfigError(f"{path}: unexpected tensor {name!r} for model {spec.name!r}")
        if tuple(t.shape) != info.shape or t.dtype != info.dtype:
            raise ConfigError(
                f"{path}: tensor {name!r} is {tuple(t.shape)} {t.dtype}, expected {info.shape} {info.dtype}"
            )
    if not partial:
        missing = [n for n in table if n not in tensors]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ConfigError(f"{path}: missing tensor {missing[0]!r}{more}")
    return Weights(spec, loaded=tensors, source=Path(path))
