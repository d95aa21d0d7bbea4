"""The task types of the FFN halves: the dense MLP (layer_mlp.py) and the MoE (layer_moe.py). Each is a typed record
(kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by name
(`fields(row, TYPE)`, kernels/runtime/tasks.py)."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class GateUp(Task, id=17, name="gate_up"):
    """A tile of the dense MLP's gate and up over a K slice."""

    n0: int  # the tile's first row of gate and up
    ks: int  # its K slice (slice 0 adds the others' sums and makes act)


GU = GateUp.constexpr()


class Down(Task, id=18, name="down_proj"):
    """A tile of down_proj over a K slice: this rank's partial."""

    n0: int  # the tile's first output column
    ks: int  # the K slice


DOWN = Down.constexpr()


class Router(Task, id=21, name="router"):
    """The router's logits of a tile of experts over a K slice, every row."""

    e0: int  # the tile's first expert
    ks: int  # the K slice


ROUTER = Router.constexpr()


class Route(Task, id=22, name="route"):
    """Row r's top-k and weights; the last row to arrive makes the slots."""

    r: int  # the row


ROUTE = Route.constexpr()


class ExpertGateUp(Task, id=23, name="expert gate_up"):
    """A tile of a slot's expert gate and up over a K slice."""

    slot: int  # the slot (the shared expert's is the last)
    n0: int  # the tile's first row
    ks: int  # its K slice


EXP_GU = ExpertGateUp.constexpr()


class ExpertDown(Task, id=24, name="expert down"):
    """A tile of a slot's down projection."""

    slot: int  # the slot
    n0: int  # the tile's first output column


EXP_DOWN = ExpertDown.constexpr()
