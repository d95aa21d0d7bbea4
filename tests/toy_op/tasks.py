"""The toy op's task types: a row doubled, then every row summed. Their ids sit far past the tree's (a type from
outside the tree takes ids no in-tree type will reach), and the runtime names them in a trace or a fault as it names
the tree's own."""

from __future__ import annotations

from glm53ctl.kernels.runtime.tasks import Task


class Double(Task, id=1000, name="toy double"):
    """Row r doubled (y = 2 x) and its largest column marked (top)."""

    r: int  # the row


DOUBLE = Double.constexpr()


class Sum(Task, id=1001, name="toy sum"):
    """Every doubled row summed, once each has been published."""


SUM = Sum.constexpr()
