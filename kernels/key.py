"""A build key resolved once, where a command starts it (docs/design.md §2, §6): what a harness, a launch and a
table read of the key, and nothing below the commands looks up again.

`tuning/knobs.py` `resolve_key` makes one (the registry's defaults, the tuned entry, the overrides, the grid for
the device, and the warnings the lookup gave, which the command prints once per key). A variant of it (a check's
other grids, a tune trial, a bench baseline) is `key.with_knobs(...)`: the same key with other knobs, resolved the
same way, with no file read again. The value is frozen and picklable: worker and rank processes are sent it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from glm53ctl.kernels.ops.gemv.kernel import folds


@dataclass(frozen=True)
class ResolvedKey:
    model: str
    kind: str
    tp: int
    rows: int
    # tokens cached before the step, for a kind that reads caches (None: its check's contexts, or no caches)
    context: int | None
    device: str | None  # the device the grid was resolved for ("cpu": the interpreter's 4 programs; None: a build)
    streams: int  # the model's mHC streams (what the norm folds depend on)
    # every knob in force, the grid resolved: the kind's typed record (kernels/kinds/base.py `KnobRecord`),
    # read by attribute (`key.knobs.block_k`)
    knobs: Mapping
    source: str = "defaults"  # "defaults", or "tuned r<revision>" where a tuned entry applied
    # what the lookup had to say (another GPU, another Triton, another context), each line naming the file
    warnings: tuple[str, ...] = ()
    bound_items: tuple[tuple[str, float], ...] = ()  # the kind's bounds (its registry entry)
    # a composite kind's parts (`model`): one resolved key per part kind, in the registry's order
    parts: tuple[ResolvedKey, ...] = field(default=(), repr=False)

    @property
    def bounds(self) -> dict[str, float]:
        return dict(self.bound_items)

    @property
    def norm_folds(self) -> bool:
        """Whether knob `norm` folds the norm into the GEMV after it at these rows (`gemv.folds`); False for a
        kind without one."""

        return "norm" in self.knobs and folds(self.knobs.norm, self.rows, self.streams)

    def part(self, kind: str) -> ResolvedKey:
        """A composite's part key of `kind`."""
        return next(p for p in self.parts if p.kind == kind)

    def with_knobs(self, overrides: dict) -> ResolvedKey:
        """This key with `overrides` over its knobs, a grid of 0 resolved for its device, as `resolve_key` does
        (no file read again, no warnings again). A step hands a grid given to it to every part (its grid is
        every part's)."""
        if not overrides:
            return self
        knobs = self.knobs.replace(**resolve_grid({**self.knobs, **overrides}, self.device))
        handed = {n: v for n, v in overrides.items() if n == "grid" or (n == "launch" and v != "parts")}
        parts = tuple(p.with_knobs(handed) for p in self.parts)
        return replace(self, knobs=knobs, parts=parts, warnings=())

    @property
    def name(self) -> str:
        """`glm53_flash/sparse/tp4/r1`, with `/ctx<N>` for a context given (kernels/checks.py `key_name`)."""
        return f"{self.model}/{self.kind}/tp{self.tp}/r{self.rows}" + (
            f"/ctx{self.context}" if self.context is not None else ""
        )


def resolve_grid(knobs: dict, device) -> dict:
    """grid 0 -> three programs per SM (4 in the interpreter, which runs programs one after another); no
    device (None): left 0, as a build for no particular GPU says it."""
    knobs = dict(knobs)
    if knobs.get("grid", 1) == 0 and device is not None:
        import torch

        dev = torch.device(device)
        knobs["grid"] = 3 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    return knobs
