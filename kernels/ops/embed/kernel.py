"""Embedding as Triton bodies (docs/model.md §7): a rank's vocab-parallel gather, and the all-reduce into the streams.

The `embed` kind runs them as tasks over column chunks; `gather` and `reduce_streams` below run the very same
bodies as plain launches, one program per chunk: how the interpreter tests check them against `naive.py`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from glm53ctl.kernels import tlx  # noqa: F401 - the interpreter's settings before any kernel is defined


@triton.jit
def gather_row(tokens, table, partial, r, vocab_offset, o_d, D: tl.constexpr, V_LOCAL: tl.constexpr):
    """Row r over columns o_d of this rank's partial [R, D] fp32: its table row for the token, if it owns it."""
    local = tl.load(tokens + r) - vocab_offset
    mine = (local >= 0) & (local < V_LOCAL)
    e_row = tl.where(mine, local, 0).to(tl.int64)
    b_e = tl.load(table + e_row * D + o_d, mask=(o_d < D) & mine, other=0.0).to(tl.float32)
    tl.store(partial + r * D + o_d, b_e, mask=o_d < D)


@triton.jit
def reduce_row(partial, peer_partials, H, r, R, o_d, D: tl.constexpr, HC: tl.constexpr, TP: tl.constexpr):
    """Row r over columns o_d of H [R, HC, D] bf16: the ranks' partials summed in rank order (this rank's, then
    the peers' [TP - 1, R, D], as the reference), the same row in every stream."""
    b_s = tl.load(partial + r * D + o_d, mask=o_d < D, other=0.0)
    for p in range(TP - 1):
        b_s += tl.load(peer_partials + (p * R + r) * D + o_d, mask=o_d < D, other=0.0)
    for j in range(HC):
        tl.store(H + (r * HC + j) * D + o_d, b_s.to(tl.bfloat16), mask=o_d < D)


@triton.jit
def gather_kernel(tokens, table, partial, R, vocab_offset, D: tl.constexpr, V_LOCAL: tl.constexpr, CHUNK: tl.constexpr):
    o_d = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    for r in range(R):
        gather_row(tokens, table, partial, r, vocab_offset, o_d, D, V_LOCAL)


@triton.jit
def reduce_kernel(
    partial, peer_partials, H, R, D: tl.constexpr, HC: tl.constexpr, TP: tl.constexpr, CHUNK: tl.constexpr
):
    o_d = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    for r in range(R):
        reduce_row(partial, peer_partials, H, r, R, o_d, D, HC, TP)


def gather(tokens: torch.Tensor, table: torch.Tensor, rank: int, chunk: int = 256) -> torch.Tensor:
    """Rank `rank`'s partial [R, D] fp32 for token ids [R] and its table shard [V/T, D] bf16."""
    (R,), (v_local, D) = tokens.shape, table.shape
    partial = torch.empty(R, D, dtype=torch.float32, device=table.device)
    gather_kernel[(triton.cdiv(D, chunk),)](
        tokens.to(torch.int32).contiguous(),
        table.contiguous(),
        partial,
        R,
        rank * v_local,
        D=D,
        V_LOCAL=v_local,
        CHUNK=chunk,
    )
    return partial


def reduce_streams(partials: torch.Tensor, streams: int, chunk: int = 256) -> torch.Tensor:
    """H [R, streams, D] bf16 from every rank's partial [T, R, D] fp32, summed in rank order."""
    T, R, D = partials.shape
    H = torch.empty(R, streams, D, dtype=torch.bfloat16, device=partials.device)
    peers = partials[1:].contiguous() if T > 1 else partials[0]
    reduce_kernel[(triton.cdiv(D, chunk),)](partials[0].contiguous(), peers, H, R, D=D, HC=streams, TP=T, CHUNK=chunk)
    return H


__all__ = ["gather", "gather_row", "reduce_row", "reduce_streams"]
