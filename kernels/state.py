"""Decode state of one rank: per-layer KDA states and DSA caches, and each row's position (docs/model.md §4, §5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KdaState:
    """One KDA layer, all rows, this rank's heads."""

    conv: torch.Tensor  # [R, W-1, 3*P_local] raw q|k|v in-projection outputs, oldest tap first (bf16)
    recurrent: torch.Tensor  # [R, H_local, K, V] fp32, S[i = key, j = value]


@dataclass
class DsaCache:
    """One DSA layer, all rows; replicated on every rank."""

    latent: torch.Tensor  # [R, Lmax, kv_lora] c_t after kv_a_layernorm (bf16)
    index_key: torch.Tensor  # [R, Lmax, ih] indexer key after its LayerNorm (bf16)
    index_gate: torch.Tensor  # [R, Lmax, ih] k-pool gate logits (bf16)
    pooled_key: torch.Tensor  # [R, Lmax // kpool, ih] pooled keys of completed pools (bf16)
