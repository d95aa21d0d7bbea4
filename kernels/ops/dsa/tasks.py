"""The task types of the MLA attention half with the DSA indexer (their dispatch and bodies in the layer kernel:
layer.py). Each is a typed record (kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the
device code reads by name (`fields(row, TYPE)`, kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class MlaA(Task, id=26, name="mla a_proj"):
    """A tile of the fused A projection, every row."""

    n0: int  # the tile's first row of q_a | kv_a | wk | pool gate | head weights


MLA_A = MlaA.constexpr()


class MlaRow(Task, id=27, name="mla row"):
    """One row's part after the A projection."""

    r: int  # the row
    part: int  # 0: q_a's norm; 1: the caches' writes and the head weights


MLA_ROW = MlaRow.constexpr()


class MlaQb(Task, id=28, name="mla q_b"):
    """A tile of q_b and the indexer's wq_b, every row."""

    n0: int  # the tile's first row of q_b | the indexer's wq_b


MLA_QB = MlaQb.constexpr()


class Absorb(Task, id=29, name="mla absorb"):
    """A head's query absorbed into the latent space, a column tile."""

    h: int  # the head
    c0: int  # the first latent column


ABSORB = Absorb.constexpr()


class Score(Task, id=30, name="index scores"):
    """The indexer's scores of a block of one row's pools."""

    r: int  # the row
    block: int  # the block of pools


SCORE = Score.constexpr()


class Select(Task, id=31, name="index select"):
    """A part's selected tokens, after the selection's passes."""

    r: int  # the row
    part: int  # the part of the pools


SELECT = Select.constexpr()


class Attn(Task, id=32, name="mla attention"):
    """The attention partials of a head group over a block of one row's selected tokens."""

    r: int  # the row
    group: int  # the first head of the head group
    block: int  # the token block


ATTN = Attn.constexpr()


class Combine(Task, id=33, name="mla combine"):
    """The blocks' partials of a head group combined, a latent column chunk."""

    r: int  # the row
    group: int  # the first head of the head group
    c0: int  # the first latent column


COMBINE = Combine.constexpr()


class Wuv(Task, id=34, name="mla w_uv"):
    """A head's latent output through W_UV, a tile of value rows."""

    h: int  # the head
    n0: int  # the first value row


WUV = Wuv.constexpr()


class SelectPass(Task, id=35, name="index select pass"):
    """A pass of the exact top-k over a part of one row's pools."""

    r: int  # the row
    step: int  # the pass, 0 to 3
    part: int  # the part of the pools


SEL_PASS = SelectPass.constexpr()
