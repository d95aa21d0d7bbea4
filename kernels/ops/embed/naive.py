"""Embedding, vocab-parallel (docs/model.md §7): each rank gathers its rows, zero elsewhere; the sum is the row."""

from __future__ import annotations

import torch

from glm53ctl.errors import UsageError
from glm53ctl.kernels.numerics import Numerics


def check_tokens(tokens: torch.Tensor, vocab: int) -> None:
    bad = tokens[(tokens < 0) | (tokens >= vocab)]
    if bad.numel():
        raise UsageError(f"token id {int(bad[0])} is out of range [0, {vocab})")


def embed_partial(tokens: torch.Tensor, table: torch.Tensor, rank: int, num: Numerics) -> torch.Tensor:
    """This rank's partial [R, D]: its rows of the table for the tokens it owns, zero for the others."""
    rows = table.shape[0]
    local = tokens - rank * rows
    mine = (local >= 0) & (local < rows)
    out = num.c(table[local.clamp(0, rows - 1)])
    return out * mine[:, None].to(out.dtype)


def streams(h: torch.Tensor, hc: int, num: Numerics) -> torch.Tensor:
    """H = [h, h, h, h] [R, hc, D], stored bf16."""
    return num.store(h[:, None, :].expand(-1, hc, -1).clone())
