"""The toy launch of one key: its table and buffers laid out once; each call is one launch."""

from __future__ import annotations

import torch

from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime
from tests.toy_kind import WIDTH
from tests.toy_kind.kernel import toy_kernel
from tests.toy_kind.table import build_table


class ToyLaunch(PersistentLaunch):
    kernel = toy_kernel

    def __init__(self, spec, tp: int, rows: int, knobs: dict, device) -> None:
        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.table = build_table(rows, knobs["handoff"], knobs["sum_first"])
        self.grid = knobs["grid"]
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid)

    def kernel_args(self, x, y, total, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS) -> dict:
        return self.runtime_args(stuck_site, budget_ns) | {"x": x, "y": y, "total": total, "R": self.rows}

    def constexprs(self) -> dict:
        return self.runtime_constexprs() | {"D": WIDTH}

    def __call__(self, x, y, total, stuck_site=-1, budget_ns=None, check=True) -> None:
        assert x.shape == y.shape == (self.rows, WIDTH) and total.shape == (self.rows,)
        self.launch(self.kernel_args(x, y, total, stuck_site, budget_ns or DEFAULT_BUDGET_NS), check)

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        f32 = torch.empty(1, dtype=torch.float32)
        return self.kernel_args(f32, f32, f32)
