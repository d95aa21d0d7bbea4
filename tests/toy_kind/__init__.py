"""A toy launch kind from outside the tree, the proof that a kind is one folder (tests/test_toy_kind.py): the
commands take it once $GLM53CTL_KINDS names this module (kernels/kinds/__init__.py), with no other file touched.

One launch: a task per row doubles it (y = 2 x) and marks its largest column (top), then one task, which waits on
every row's (a guarded wait: the sites `fault` sticks), sums each doubled row (total).

$GLM53CTL_TOY_DEFECT plants one defect in the launch (tests/test_verdicts.py: each verdict of `check` and `fault`
shown failing on a real launch): a compile-time constant of the kernel, so a defective build is a build of its
own. Its tasks are the runtime's own no-op type (`HOP`), the first
argument telling the two apart: a kind from outside the tree has no ids of its own in the one id space.
"""

import os
import sys

from glm53ctl.kernels.kinds.base import Kind, Knob, facts

KNOBS = (Knob("sum_first", (0, 1), 0, "schedule", "the sum's task first in the table (it waits either way)"),)
RUNTIME = ("grid", "warps", "handoff", "poll")
RUNTIME_DEFAULTS = {"handoff": "flag"}
# doubling is exact; the sum adds in the kernel's order, the reference in torch's
BOUNDS = {"y": 0.0, "total": 1e-6}
WIDTH = 32  # columns of a row

DEFECTS = (
    "",  # none
    "accuracy",  # row 0 of y a quarter off
    "nan",  # row 0's total NaN
    "unwritten",  # the last row's top and total never stored (their poison left)
    "invariant",  # each top one column past the row's largest
    "grids",  # total one ulp off at an odd program count
    "repeats",  # total one ulp off in every second launch
    "tag",  # the launch does not advance its tag
    "unguarded",  # the sum's wait spins on its stuck site with no budget: a hang
    "silent",  # the sum's wait not told it is stuck: no LaunchFault
    "misnamed",  # the guard sticks the next site, so the fault names another
    "scarred",  # a faulted launch leaves a mark the next launch adds into y
)


def defect() -> int:
    """The planted defect's number (0: none), from $GLM53CTL_TOY_DEFECT."""
    name = os.environ.get("GLM53CTL_TOY_DEFECT", "")
    if name not in DEFECTS:
        raise ValueError(f"GLM53CTL_TOY_DEFECT={name}: one of {', '.join(DEFECTS[1:])}")
    return DEFECTS.index(name)


# the kind's one registry line
KIND = Kind(
    "toy",
    "doubles each row, then sums it (a test)",
    "tests.toy_kind.harness:run_reference",
    "tests.toy_kind.harness:ToyHarness",
    **facts(sys.modules[__name__]),
)
