"""The task types of the MLA attention half with the DSA indexer (kernels/kinds/layer/mla.py). Each is a typed record
(kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by name through
the one unpacking function beside it (`<type>_fields(row)`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


@dataclass(frozen=True)
class MlaA(Task):
    """A tile of the fused A projection, every row."""

    ID: ClassVar[int] = 26
    NAME: ClassVar[str] = "mla a_proj"
    n0: int  # the tile's first row of q_a | kv_a | wk | pool gate | head weights


MLA_A = MlaA.constexpr()


@triton.jit
def mla_a_fields(row):
    """MlaA's fields from its table row: n0."""
    return row[1]


@dataclass(frozen=True)
class MlaRow(Task):
    """One row's part after the A projection."""

    ID: ClassVar[int] = 27
    NAME: ClassVar[str] = "mla row"
    r: int  # the row
    part: int  # 0: q_a's norm; 1: the caches' writes and the head weights


MLA_ROW = MlaRow.constexpr()


@triton.jit
def mla_row_fields(row):
    """MlaRow's fields from its table row: r, part."""
    return row[1], row[2]


@dataclass(frozen=True)
class MlaQb(Task):
    """A tile of q_b and the indexer's wq_b, every row."""

    ID: ClassVar[int] = 28
    NAME: ClassVar[str] = "mla q_b"
    n0: int  # the tile's first row of q_b | the indexer's wq_b


MLA_QB = MlaQb.constexpr()


@triton.jit
def mla_qb_fields(row):
    """MlaQb's fields from its table row: n0."""
    return row[1]


@dataclass(frozen=True)
class Absorb(Task):
    """A head's query absorbed into the latent space, a column tile."""

    ID: ClassVar[int] = 29
    NAME: ClassVar[str] = "mla absorb"
    h: int  # the head
    c0: int  # the first latent column


ABSORB = Absorb.constexpr()


@triton.jit
def absorb_fields(row):
    """Absorb's fields from its table row: h, c0."""
    return row[1], row[2]


@dataclass(frozen=True)
class Score(Task):
    """The indexer's scores of a block of one row's pools."""

    ID: ClassVar[int] = 30
    NAME: ClassVar[str] = "index scores"
    r: int  # the row
    block: int  # the block of pools


SCORE = Score.constexpr()


@triton.jit
def score_fields(row):
    """Score's fields from its table row: r, block."""
    return row[1], row[2]


@dataclass(frozen=True)
class Select(Task):
    """A part's selected tokens, after the selection's passes."""

    ID: ClassVar[int] = 31
    NAME: ClassVar[str] = "index select"
    r: int  # the row
    part: int  # the part of the pools


SELECT = Select.constexpr()


@triton.jit
def select_fields(row):
    """Select's fields from its table row: r, part."""
    return row[1], row[2]


@dataclass(frozen=True)
class Attn(Task):
    """The attention partials of a head group over a block of one row's selected tokens."""

    ID: ClassVar[int] = 32
    NAME: ClassVar[str] = "mla attention"
    r: int  # the row
    group: int  # the first head of the head group
    block: int  # the token block


ATTN = Attn.constexpr()


@triton.jit
def attn_fields(row):
    """Attn's fields from its table row: r, group, block."""
    return row[1], row[2], row[3]


@dataclass(frozen=True)
class Combine(Task):
    """The blocks' partials of a head group combined, a latent column chunk."""

    ID: ClassVar[int] = 33
    NAME: ClassVar[str] = "mla combine"
    r: int  # the row
    group: int  # the first head of the head group
    c0: int  # the first latent column


COMBINE = Combine.constexpr()


@triton.jit
def combine_fields(row):
    """Combine's fields from its table row: r, group, c0."""
    return row[1], row[2], row[3]


@dataclass(frozen=True)
class Wuv(Task):
    """A head's latent output through W_UV, a tile of value rows."""

    ID: ClassVar[int] = 34
    NAME: ClassVar[str] = "mla w_uv"
    h: int  # the head
    n0: int  # the first value row


WUV = Wuv.constexpr()


@triton.jit
def wuv_fields(row):
    """Wuv's fields from its table row: h, n0."""
    return row[1], row[2]


@dataclass(frozen=True)
class SelectPass(Task):
    """A pass of the exact top-k over a part of one row's pools."""

    ID: ClassVar[int] = 35
    NAME: ClassVar[str] = "index select pass"
    r: int  # the row
    step: int  # the pass, 0 to 3
    part: int  # the part of the pools


SEL_PASS = SelectPass.constexpr()


@triton.jit
def sel_pass_fields(row):
    """SelectPass's fields from its table row: r, step, part."""
    return row[1], row[2], row[3]
