"""Which models a kind's kernels run: the rules of its folder's `DIMS` (kinds/dims.py) asked of a model at a TP
width, through the registry (a step's rules are every part's and its own)."""

from __future__ import annotations

from glm53ctl.errors import UsageError
from glm53ctl.kernels.kinds import get_kind
from glm53ctl.kernels.kinds.dims import Broken, field_value


def broken(spec, kind: str, tp: int) -> list[Broken]:
    """The rules of `kind`'s kernels (a step's: every part's, and its own) that `spec` breaks at TP `tp`."""
    entry = get_kind(kind)
    out = []
    for name in (kind, *entry.parts):
        for dim in get_kind(name).dims:
            v = dim.value(spec, tp)
            if not dim.rule.holds(v):
                who = name if name == kind else f"{kind} ({name})"
                out.append(Broken(who, tp, dim, v, field_value(spec, dim.field), dim.nearest(spec, tp)))
    return list({str(b): b for b in out}.values())


def check_runs(spec, kind: str, tp: int) -> None:
    """Exit 2 before anything launches where `kind`'s kernels cannot run `spec` at TP `tp`."""
    bad = broken(spec, kind, tp)
    if bad:
        raise UsageError(
            f"model {spec.name!r} cannot run on the {kind} kernels at TP {tp}: "
            + "; ".join(str(b) for b in bad[:3])
            + (f"; and {len(bad) - 3} more" if len(bad) > 3 else ""),
            hint="`glm53ctl configs validate FILE` says which kinds and TP widths a model file can run; "
            "the reference backend (`run --backend reference`) runs any",
        )


def runnable(spec, kinds: list[str], tps: tuple[int, ...]) -> dict[str, dict[int, list[Broken]]]:
    """Per kind, per TP width that shards the model: what it breaks there (empty: it runs)."""
    out: dict[str, dict[int, list[Broken]]] = {}
    for kind in kinds:
        out[kind] = {}
        for tp in tps:
            if all(v % tp == 0 for v in spec.sharded_dims().values()):
                out[kind][tp] = broken(spec, kind, tp)
    return out
