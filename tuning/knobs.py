"""The knob registry (DESIGN.md §5): every knob's values, default, the kinds it applies to, and its class.

`schedule` knobs must leave every output and every write bitwise equal to the default; `numeric` knobs
must stay within the reference tolerance. Kernels contain no tuned numbers: a launch gets its knobs
from `knobs_for` (defaults, then the tuned config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KnobClass = Literal["schedule", "numeric"]


@dataclass(frozen=True, slots=True)
class Knob:
    name: str
    values: tuple
    default: object
    kinds: tuple[str, ...]
    cls: KnobClass
    help: str
    per_kind: tuple[tuple[str, object], ...] = ()  # (kind, default) where a kind's best differs

    def default_for(self, kind: str) -> object:
        return dict(self.per_kind).get(kind, self.default)


# grid 0: three programs per SM on a GPU (4 programs in the interpreter). The defaults below are the best
# of the sweeps in docs/perf/ (H200): tail's in 2026-11-30-runtime-embed-tail.md (TP4/TP8, rows 1/8), dense's
# in 2026-11-30-dense.md.
KNOBS = {
    k.name: k
    for k in (
        Knob("grid", (0, 132, 264, 396), 0, ("embed", "tail", "dense"), "schedule", "programs in the persistent grid"),
        # warps: the layout of a tl.sum's operands, so its reduction order (dense's gates and KDA heads differ in
        # the last bit at 8 warps on the H200, docs/perf/2026-11-30-dense.md): numeric
        Knob("warps", (4, 8), 4, ("embed", "tail", "dense"), "numeric", "warps per program"),
        Knob(
            "handoff",
            ("flag", "box"),
            "box",
            ("embed", "tail", "dense"),
            "schedule",
            "broadcast hand-off: one flag word per producer, or per-consumer 128-byte box lines",
        ),
        Knob(
            "poll",
            (0, 1, 2),
            1,
            ("embed", "tail", "dense"),
            "schedule",
            "0: every thread polls with ld.acquire.gpu; 1: relaxed polls (+64 ns sleep), then one acquire; "
            "2: as 1 with 512 ns sleeps (less traffic from many waiters); the clock and abort word every 8th poll",
            # dense on the H200, once a wait read its clock and abort word every 8th round only: 0 faster at all 5
            # keys traced, 1-3% (docs/perf/2026-11-30-dense.md)
            per_kind=(("dense", 0),),
        ),
        Knob("block_n", (16, 32, 64, 128), 64, ("tail",), "schedule", "GEMV output rows per task"),
        # dense: a tile per stage, so each stage has enough tasks (defaults: the best of the H200 sweep in
        # docs/perf/2026-11-30-dense.md)
        Knob("block_n_in", (16, 32, 64), 32, ("dense",), "schedule", "in-projection rows per task"),
        Knob(
            "block_n_gu",
            (16, 32, 64),
            32,
            ("dense",),
            "schedule",
            "gate/up rows per task (each task runs both GEMVs and the SwiGLU over them)",
        ),
        Knob(
            "block_n_out",
            (16, 32, 64, 128),
            32,
            ("dense",),
            "schedule",
            "GEMV output rows per task of the narrow stages that end in a reduce (o_proj, down_proj)",
        ),
        Knob(
            "box_words",
            (8, 16, 32),
            32,
            ("dense",),
            "schedule",
            "producers per 128-byte box line a consumer polls (fewer: more lines, less contention per line)",
        ),
        Knob(
            "oproj_first",
            (0, 1),
            0,
            ("dense",),
            "schedule",
            "a KDA task publishes z, its program runs the next task (o_proj), then writes the states back",
        ),
        Knob(
            "kda_split",
            (0, 1, 2, 4),
            0,
            ("dense",),
            "schedule",
            "programs per KDA head, each on its share of the state's value columns (the last to arrive makes z); "
            "0: the most of 4, 2, 1 whose parts the grid's programs cover",
        ),
        Knob(
            "chunk_cols",
            (64, 128, 256),
            128,
            ("dense",),
            "numeric",
            "columns per mix / reduce task (more, smaller tasks on the chain's latency-bound steps)",
        ),
        Knob(
            "ksplit",
            (1, 2, 4),
            2,
            ("dense",),
            "numeric",
            "K slices of o_proj and down_proj (more tasks on narrow stages); fewer where K is narrow",
        ),
        Knob(
            "ksplit_gu",
            (1, 2, 4),
            2,
            ("dense",),
            "numeric",
            "K slices of gate/up (shorter loops: a program's stream is latency-bound); slice 0 adds them in order",
        ),
        Knob(
            "ksplit_in",
            (1, 2, 4),
            1,
            ("dense",),
            "numeric",
            "K slices of the in-projection (shorter loops: a program's stream is latency-bound); slice 0 adds them",
        ),
        Knob(
            "block_k",
            (64, 128, 256, 512),
            128,
            ("tail", "dense"),
            "numeric",
            "GEMV K tile: it sets the fp32 reduction order",
        ),
        Knob(
            "maxnreg",
            (0, 168, 128),
            0,
            ("dense",),
            "schedule",
            "registers a thread may hold (0: the compiler's choice, 240-255 for dense: 2 programs of 4 warps per SM; "
            "168: 3, 128: 4), so that more of the grid's programs are resident at once",
        ),
        Knob(
            "stages",
            (1, 2, 3, 4, 6, 8),
            4,
            ("tail", "dense"),
            "schedule",
            "software-pipelining depth of the GEMV's K loop",
            per_kind=(("tail", 3),),
        ),
        Knob(
            "prefetch",
            (0, 1, 2, 3),
            0,
            ("tail", "dense"),
            "schedule",
            "before its wait, a task asks L2 for what no producer writes (GEMV weights; dense: the KDA state); "
            "dense 2: only o_proj, gate/up and down; dense 3: only the KDA heads' and attention reduces' own "
            "operands; tail: any value but 0 prefetches its GEMV tiles",
            # dense on the H200 once no KDA part waits for another: 3 faster at 5 of 6 keys traced (TP8 rows 8 by
            # 11%), within 0.3% at the sixth (docs/perf/2026-11-30-dense.md)
            per_kind=(("dense", 3),),
        ),
        Knob(
            "ffn_mix",
            ("reduce", "task", "auto"),
            "auto",
            ("dense",),
            "schedule",
            "the FFN gate's mix logits of a column chunk: made by the attention reduce of the chunk, or by a task of "
            "their own after it (a folded gate/up waits only for the reduces' H1, so starts sooner); auto: task "
            "where gate/up folds the norm (knob norm)",
        ),
        Knob(
            "gathers",
            ("first", "last"),
            "last",
            ("tail",),
            "schedule",
            "the peers' logits copies: before the GEMV tasks (overlap the norm) or after them in the table (with "
            "split even: beside the stream, on the programs kept out of the deal)",
        ),
        Knob(
            "split",
            ("tiles", "even"),
            "even",
            ("tail",),
            "schedule",
            "lm_head rows per GEMV task: block_n, or dealt evenly over the grid's programs (up to block_n; "
            "with gathers last, a program in 16 kept for the gathers)",
        ),
        Knob(
            "norm",
            ("task", "fold", "auto"),
            "fold",
            ("tail", "dense"),
            "numeric",
            "the GEMV after a norm (tail: lm_head; dense: the in-projection and gate/up) waits for the normalized "
            "rows (task), or streams H's stream rows against its weights with the norm weight folded in and waits "
            "for the rows' scale (1/RMS; dense: and the gate's pre) only at its end (fold); auto: fold where the "
            "stream rows fit a 16-row tile (rows <= 4), else task",
            per_kind=(("dense", "auto"),),
        ),
        Knob("chunk", (256, 512, 1024), 1024, ("embed",), "schedule", "hidden-dim columns per embed task"),
    )
}


def defaults(kind: str) -> dict[str, object]:
    return {k.name: k.default_for(kind) for k in KNOBS.values() if kind in k.kinds}


def resolve_grid(knobs: dict, device) -> dict:
    """grid 0 -> three programs per SM (4 in the interpreter, which runs programs one after another)."""
    import torch

    knobs = dict(knobs)
    if knobs.get("grid", 1) == 0:
        dev = torch.device(device)
        knobs["grid"] = 3 * torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 4
    return knobs


def check_knobs(kind: str, knobs: dict) -> None:
    from glm53ctl.errors import UsageError

    for name, value in knobs.items():
        k = KNOBS.get(name)
        if k is None or kind not in k.kinds:
            raise UsageError(
                f"knob {name!r} does not apply to {kind}", hint=f"{kind} knobs: {', '.join(defaults(kind))}"
            )
        if name != "grid" and value not in k.values:
            raise UsageError(f"knob {name}={value!r}: expected one of {', '.join(map(str, k.values))}")


def knobs_for(model: str, kind: str, tp: int, rows: int, overrides: dict | None = None, device=None) -> dict:
    """The knobs in force for one build key (DESIGN.md §6): the registry's defaults, then the tuned entry of
    configs/tuned/<model>/tp<T>.json for (kind, rows) if there is one, then explicit overrides. A tuned
    entry measured on another GPU capability or Triton minor version is used with a warning."""
    from glm53ctl import tuned
    from glm53ctl.output import print_warning
    from glm53ctl.paths import tuned_path

    knobs = defaults(kind)
    path = tuned_path(model, tp)
    if path.exists():
        cap = triton_version = None
        if device is not None and str(device).startswith("cuda"):
            import torch
            import triton

            major, minor = torch.cuda.get_device_capability(device)
            cap, triton_version = f"{major}.{minor}", triton.__version__
        knobs, _, warnings = tuned.lookup(tuned.load(path), kind, rows, knobs, cap, triton_version)
        for w in warnings:
            print_warning(f"{path}: {kind} rows={rows}: {w}")
    knobs = {**knobs, **(overrides or {})}
    check_knobs(kind, knobs)
    return knobs
