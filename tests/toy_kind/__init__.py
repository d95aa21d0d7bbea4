"""A toy launch kind from outside the tree, the proof that a kind is one folder (tests/test_toy_kind.py): the
commands take it once $GLM53CTL_KINDS names this module (kernels/kinds/__init__.py), with no other file touched.

One launch: a task per row doubles it (y = 2 x), then one task, which waits on every row's (a guarded wait: the
sites `fault` sticks), sums each doubled row (total). Its tasks are the runtime's own no-op type (`HOP`), the first
argument telling the two apart: a kind from outside the tree has no ids of its own in the one id space.
"""

import sys

from glm53ctl.kernels.kinds.base import Kind, Knob, facts

KNOBS = (Knob("sum_first", (0, 1), 0, "schedule", "the sum's task first in the table (it waits either way)"),)
RUNTIME = ("grid", "warps", "handoff", "poll")
RUNTIME_DEFAULTS = {"handoff": "flag"}
# doubling is exact; the sum adds in the kernel's order, the reference in torch's
BOUNDS = {"y": 0.0, "total": 1e-6}
WIDTH = 32  # columns of a row


def _harness():
    from tests.toy_kind.harness import ToyHarness

    return ToyHarness


def _reference():
    from tests.toy_kind.harness import run_reference

    return run_reference


# the kind's one registry line
KIND = Kind("toy", "doubles each row, then sums it (a test)", _reference, _harness, **facts(sys.modules[__name__]))
