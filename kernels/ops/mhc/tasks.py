"""The task types of the mHC gates, mixes and all-reduces every layer has (kernels/kinds/layer/shared.py). Each is a
typed record (kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by name
(`fields(row, TYPE)`, kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class MixA(Task, id=6, name="attn mix"):
    """A column chunk of one row's attention-gate mix logits, sum of squares and Gram matrix."""

    c: int  # the column chunk
    r: int  # the row


MIX_A = MixA.constexpr()


class GateA(Task, id=7, name="attn gate"):
    """Row r's attention gate (hc_pre without the comb) and chunk c of x̂; chunk 0 also post, pre and 1/RMS."""

    r: int  # the row
    c: int  # the column chunk


GATE_A = GateA.constexpr()


class CombA(Task, id=8, name="attn comb"):
    """Row r's Sinkhorn comb (for hc_post)."""

    r: int  # the row


COMB_A = CombA.constexpr()


class ReduceA(Task, id=12, name="attn reduce"):
    """A column chunk of one row: the attention partials summed in rank order, hc_post (H1)."""

    c: int  # the column chunk
    r: int  # the row


RED_A = ReduceA.constexpr()


class OwnA(Task, id=13, name="attn partial"):
    """A column chunk of this rank's attention partial, for its peers."""

    c: int  # the column chunk
    r: int  # the row


OWN_A = OwnA.constexpr()


class MixF(Task, id=14, name="ffn mix"):
    """A column chunk of one row's FFN-gate mix logits, as a task of its own."""

    c: int  # the column chunk
    r: int  # the row


MIX_F = MixF.constexpr()


class GateF(Task, id=15, name="ffn gate"):
    """Row r's FFN gate on H1 and chunk c of x̂."""

    r: int  # the row
    c: int  # the column chunk


GATE_F = GateF.constexpr()


class CombF(Task, id=16, name="ffn comb"):
    """Row r's FFN comb."""

    r: int  # the row


COMB_F = CombF.constexpr()


class ReduceF(Task, id=19, name="ffn reduce"):
    """A column chunk of one row: the FFN partials summed in rank order, hc_post (H)."""

    c: int  # the column chunk
    r: int  # the row


RED_F = ReduceF.constexpr()


class OwnF(Task, id=20, name="ffn partial"):
    """A column chunk of this rank's FFN partial, for its peers."""

    c: int  # the column chunk
    r: int  # the row


OWN_F = OwnF.constexpr()
