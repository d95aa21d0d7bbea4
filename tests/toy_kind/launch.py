"""The toy launch of one key: its table and buffers laid out once; each call is one launch."""

from __future__ import annotations

import torch

from glm53ctl.kernels.kinds.base import KnobRecord
from glm53ctl.kernels.runtime.launch import DEFAULT_BUDGET_NS, PersistentLaunch, Runtime
from tests.toy_kind import DEFECTS, WIDTH, defect
from tests.toy_kind.kernel import toy_kernel
from tests.toy_kind.table import build_table


class ToyLaunch(PersistentLaunch):
    kernel = toy_kernel

    def __init__(self, spec, tp: int, rows: int, knobs: KnobRecord, device) -> None:
        self.spec, self.tp, self.rows, self.knobs = spec, tp, rows, knobs
        self.table = build_table(rows, knobs.handoff, knobs.sum_first)
        self.grid = knobs.grid
        self.runtime = Runtime(self.table, torch.device(device), max_programs=self.grid)
        self.defect = defect()
        self.scar = torch.zeros(1, device=device)  # the `scarred` defect's mark, kept from launch to launch

    def kernel_args(self, x, y, top, total, stuck_site=-1, budget_ns=DEFAULT_BUDGET_NS) -> dict:
        tensors = {"x": x, "y": y, "top": top, "total": total, "scar": self.scar, "R": self.rows}
        return self.runtime_args(stuck_site, budget_ns) | tensors

    def constexprs(self) -> dict:
        return self.runtime_constexprs() | {"D": WIDTH, "DEFECT": self.defect}

    def __call__(self, x, y, top, total, stuck_site=-1, budget_ns=None, check=True) -> None:
        assert x.shape == y.shape == (self.rows, WIDTH) and top.shape == total.shape == (self.rows,)
        args = self.kernel_args(x, y, top, total, stuck_site, budget_ns or DEFAULT_BUDGET_NS)
        if DEFECTS[self.defect] == "tag":  # the tag left where it was: the next launch reuses it
            tag = int(self.runtime.ctl[0])
            try:
                self.launch(args, check)
            finally:
                self.runtime.ctl[0] = tag
            return
        self.launch(args, check)

    def placeholder_args(self) -> dict:
        """The kernel's arguments with stand-in tensors of the right dtypes (ahead-of-time builds)."""
        f32, i32 = torch.empty(1, dtype=torch.float32), torch.empty(1, dtype=torch.int32)
        return self.kernel_args(f32, f32, i32, f32)
