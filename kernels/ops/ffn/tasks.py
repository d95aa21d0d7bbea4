"""The task types of the FFN halves: the dense MLP (layer_mlp.py) and the MoE (layer_moe.py). Each is a typed record
(kernels/runtime/tasks.py `Task`): its id, its name and its fields, which the device code reads by name through the
one unpacking function beside it (`<type>_fields(row)`)."""

from __future__ import annotations

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


class GateUp(Task, id=17, name="gate_up"):
    """A tile of the dense MLP's gate and up over a K slice."""

    n0: int  # the tile's first row of gate and up
    ks: int  # its K slice (slice 0 adds the others' sums and makes act)


GU = GateUp.constexpr()


@triton.jit
def gu_fields(row):
    """GateUp's fields from its table row: n0, ks."""
    return row[1], row[2]


class Down(Task, id=18, name="down_proj"):
    """A tile of down_proj over a K slice: this rank's partial."""

    n0: int  # the tile's first output column
    ks: int  # the K slice


DOWN = Down.constexpr()


@triton.jit
def down_fields(row):
    """Down's fields from its table row: n0, ks."""
    return row[1], row[2]


class Router(Task, id=21, name="router"):
    """The router's logits of a tile of experts over a K slice, every row."""

    e0: int  # the tile's first expert
    ks: int  # the K slice


ROUTER = Router.constexpr()


@triton.jit
def router_fields(row):
    """Router's fields from its table row: e0, ks."""
    return row[1], row[2]


class Route(Task, id=22, name="route"):
    """Row r's top-k and weights; the last row to arrive makes the slots."""

    r: int  # the row


ROUTE = Route.constexpr()


@triton.jit
def route_fields(row):
    """Route's fields from its table row: r."""
    return row[1]


class ExpertGateUp(Task, id=23, name="expert gate_up"):
    """A tile of a slot's expert gate and up over a K slice."""

    slot: int  # the slot (the shared expert's is the last)
    n0: int  # the tile's first row
    ks: int  # its K slice


EXP_GU = ExpertGateUp.constexpr()


@triton.jit
def exp_gu_fields(row):
    """ExpertGateUp's fields from its table row: slot, n0, ks."""
    return row[1], row[2], row[3]


class ExpertDown(Task, id=24, name="expert down"):
    """A tile of a slot's down projection."""

    slot: int  # the slot
    n0: int  # the tile's first output column


EXP_DOWN = ExpertDown.constexpr()


@triton.jit
def exp_down_fields(row):
    """ExpertDown's fields from its table row: slot, n0."""
    return row[1], row[2]
