"""The toy op's task types: a row doubled, then every row summed. Their ids sit far past the tree's (a type from
outside the tree takes ids no in-tree type will reach), and the runtime names them in a trace or a fault as it
names the tree's own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import triton
import triton.language as tl  # noqa: F401  (the interpreter patches it in the jit functions' globals)

from glm53ctl.kernels.runtime.tasks import Task


@dataclass(frozen=True)
class Double(Task):
    """Row r doubled (y = 2 x) and its largest column marked (top)."""

    ID: ClassVar[int] = 1000
    NAME: ClassVar[str] = "toy double"
    r: int  # the row


DOUBLE = Double.constexpr()


@triton.jit
def double_fields(row):
    """Double's fields from its table row: r."""
    return row[1]


@dataclass(frozen=True)
class Sum(Task):
    """Every doubled row summed, once each has been published."""

    ID: ClassVar[int] = 1001
    NAME: ClassVar[str] = "toy sum"


SUM = Sum.constexpr()
