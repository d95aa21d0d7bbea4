"""What `glm53ctl run` runs: the run key and its checks, light enough (no torch) to refuse bad input before any
heavy import or progress line."""

from __future__ import annotations

from dataclasses import dataclass

from glm53ctl.errors import UsageError
from glm53ctl.kernels.kinds import KINDS, LAYER_KINDS, get_kind, load_harness


@dataclass(frozen=True)
class RunKey:
    kind: str
    tp: int
    rows: int
    context: int = 0
    steps: int = 1
    seed: int = 0
    layer: int | None = None
    tokens: tuple[int, ...] | None = None  # token ids (embed: the last step's; model: the first's); else seeded


def row_contexts(context: int, rows: int, kpool: int) -> list[int]:
    """Row r sits `r * (kpool - 1)` tokens short of the context: different positions and pool phases."""
    return [max(context - r * (kpool - 1), 0) for r in range(rows)]


def layer_for(spec, kind: str, layer: int | None) -> int:
    """The layer a layer kind runs: the given one (checked against the model), else the model's first of its shape."""
    want = LAYER_KINDS[kind]
    if layer is None:
        for i, shape in enumerate(spec.layers):
            if shape == want:
                return i
        raise UsageError(f"model {spec.name!r} has no {kind} layer")
    if not 0 <= layer < spec.model.num_layers:
        raise UsageError(f"layer {layer} is out of range [0, {spec.model.num_layers})")
    if spec.layers[layer] != want:
        raise UsageError(f"layer {layer} of {spec.name!r} is {'+'.join(spec.layers[layer])}, not a {kind} layer")
    return layer


def check_run_key(key: RunKey) -> None:
    """Refuse a run key no kind can run, before any work."""
    kind = get_kind(key.kind)
    if key.rows not in range(1, 9):  # the kernels and the reference take any; the commands take ROWS (run.py)
        raise UsageError(f"rows {key.rows} is out of range 1..8")
    if key.steps < 1:
        raise UsageError(f"--steps {key.steps}: expected at least 1")
    if key.context < 0:
        raise UsageError(f"--context {key.context}: expected 0 or more")
    if key.layer is not None and kind.layer is None:
        raise UsageError(f"--layer applies to the layer kinds ({', '.join(LAYER_KINDS)}), not to {key.kind}")
    if key.tokens is not None:
        if not kind.takes_tokens:
            readers = " and ".join(n for n, k in KINDS.items() if k.takes_tokens)
            raise UsageError(f"--tokens applies to {readers}, not to {key.kind}")
        if len(key.tokens) != key.rows:
            raise UsageError(f"--tokens has {len(key.tokens)} ids for {key.rows} rows")


def run_reference(ref, key: RunKey):
    """`glm53ctl run`'s reference run of the key's kind (kernels/kinds/harness.py): inputs.*, outputs.*, writes.*."""
    check_run_key(key)
    return get_kind(key.kind).load_reference()(ref, key)


def run_triton(weights, key: RunKey, resolved):
    """`glm53ctl run --backend triton`: the saved tensors of run_reference's layout, the launch at `resolved`."""
    check_run_key(key)
    return load_harness(key.kind).run(weights, key, resolved)
