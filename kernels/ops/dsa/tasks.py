"""The task types of the MLA attention half with the DSA indexer (their dispatch and bodies in the layer kernel:
layer.py). Each is a typed record (kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the
device code reads by name through the one unpacking function beside it (`<type>_fields(row)`)."""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


class MlaA(Task, id=26, name="mla a_proj"):
    """A tile of the fused A projection, every row."""

    n0: int  # the tile's first row of q_a | kv_a | wk | pool gate | head weights


MLA_A = MlaA.constexpr()


@triton.jit
def mla_a_fields(row):
    """MlaA's fields from its table row: n0."""
    return row[1]


class MlaRow(Task, id=27, name="mla row"):
    """One row's part after the A projection."""

    r: int  # the row
    part: int  # 0: q_a's norm; 1: the caches' writes and the head weights


MLA_ROW = MlaRow.constexpr()


@triton.jit
def mla_row_fields(row):
    """MlaRow's fields from its table row: r, part."""
    return row[1], row[2]


class MlaQb(Task, id=28, name="mla q_b"):
    """A tile of q_b and the indexer's wq_b, every row."""

    n0: int  # the tile's first row of q_b | the indexer's wq_b


MLA_QB = MlaQb.constexpr()


@triton.jit
def mla_qb_fields(row):
    """MlaQb's fields from its table row: n0."""
    return row[1]


class Absorb(Task, id=29, name="mla absorb"):
    """A head's query absorbed into the latent space, a column tile."""

    h: int  # the head
    c0: int  # the first latent column


ABSORB = Absorb.constexpr()


@triton.jit
def absorb_fields(row):
    """Absorb's fields from its table row: h, c0."""
    return row[1], row[2]


class Score(Task, id=30, name="index scores"):
    """The indexer's scores of a block of one row's pools."""

    r: int  # the row
    block: int  # the block of pools


SCORE = Score.constexpr()


@triton.jit
def score_fields(row):
    """Score's fields from its table row: r, block."""
    return row[1], row[2]


class Select(Task, id=31, name="index select"):
    """A part's selected tokens, after the selection's passes."""

    r: int  # the row
    part: int  # the part of the pools


SELECT = Select.constexpr()


@triton.jit
def select_fields(row):
    """Select's fields from its table row: r, part."""
    return row[1], row[2]


class Attn(Task, id=32, name="mla attention"):
    """The attention partials of a head group over a block of one row's selected tokens."""

    r: int  # the row
    group: int  # the first head of the head group
    block: int  # the token block


ATTN = Attn.constexpr()


@triton.jit
def attn_fields(row):
    """Attn's fields from its table row: r, group, block."""
    return row[1], row[2], row[3]


class Combine(Task, id=33, name="mla combine"):
    """The blocks' partials of a head group combined, a latent column chunk."""

    r: int  # the row
    group: int  # the first head of the head group
    c0: int  # the first latent column


COMBINE = Combine.constexpr()


@triton.jit
def combine_fields(row):
    """Combine's fields from its table row: r, group, c0."""
    return row[1], row[2], row[3]


class Wuv(Task, id=34, name="mla w_uv"):
    """A head's latent output through W_UV, a tile of value rows."""

    h: int  # the head
    n0: int  # the first value row


WUV = Wuv.constexpr()


@triton.jit
def wuv_fields(row):
    """Wuv's fields from its table row: h, n0."""
    return row[1], row[2]


class SelectPass(Task, id=35, name="index select pass"):
    """A pass of the exact top-k over a part of one row's pools."""

    r: int  # the row
    step: int  # the pass, 0 to 3
    part: int  # the part of the pools


SEL_PASS = SelectPass.constexpr()


@triton.jit
def sel_pass_fields(row):
    """SelectPass's fields from its table row: r, step, part."""
    return row[1], row[2], row[3]


class SelectRow(Task, id=36, name="index select row"):
    """A row's whole selection in one program, where its pools fit one (knob select=row)."""

    r: int  # the row


SEL_ROW = SelectRow.constexpr()


@triton.jit
def sel_row_fields(row):
    """SelectRow's field from its table row: r."""
    return row[1]
