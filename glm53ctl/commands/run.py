"""`glm53ctl run`: one launch kind; every output and every write saved with the inputs that reproduce it."""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from glm53ctl import __version__
from glm53ctl.commands import Command
from glm53ctl.commands.keys import KernelCacheOpt, counted_compiles, print_kernels, ranks_width
from glm53ctl.errors import UsageError
from glm53ctl.files import check_replaceable, write_atomic_with
from glm53ctl.kernels.checks import run_on_ranks
from glm53ctl.kernels.kernel_cache import counting
from glm53ctl.kernels.kinds import KINDS, ranks_kinds
from glm53ctl.kernels.kinds.run_key import RunKey, check_run_key, layer_for, run_reference, run_triton
from glm53ctl.kernels.numerics import FP32, FP64
from glm53ctl.kernels.reference import Reference
from glm53ctl.kernels.runtime.ranks import WeightsSource
from glm53ctl.kernels.sizes import check_fits, check_positions, launch_needs, run_needs
from glm53ctl.kernels.spec import ROW_COUNTS, load_model
from glm53ctl.kernels.weights import Weights, load_weights, save_weights
from glm53ctl.output import Output, print_warning
from glm53ctl.tuning.knobs import resolve_key


class Backend(StrEnum):
    reference = "reference"
    triton = "triton"


KERNEL_PRECISION = "bf16 weights and hand-offs, fp32 sums"


class Precision(StrEnum):
    fp32 = "fp32"
    fp64 = "fp64"


def register(app: typer.Typer) -> None:
    app.command(name="run", cls=Command)(run)


def _kinds_in_words() -> str:
    """The registry's kinds as `--kind`'s help says them: "embed, dense, kda, sparse, tail or model"."""

    *most, last = KINDS
    return f"{', '.join(most)} or {last}" if most else last


def run(
    kind: Annotated[str, typer.Option("--kind", "-k", help=f"{_kinds_in_words()}.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="safetensors file to write.")],
    model: Annotated[str, typer.Option("--model", "-m", help="Model name or .toml path.")] = "tiny",
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel width (1, 2, 4, 8).")] = 1,
    rows: Annotated[int, typer.Option("--rows", help="Rows per step (1-8).")] = 1,
    context: Annotated[int, typer.Option("--context", help="Tokens cached before the step (row r: r*3 fewer).")] = 0,
    steps: Annotated[int, typer.Option("--steps", help="Steps to run; the last one is saved.")] = 1,
    layer: Annotated[int | None, typer.Option("--layer", help="Layer of a layer kind (default: its first).")] = None,
    tokens: Annotated[
        str | None,
        typer.Option(
            "--tokens", help="Token ids, one per row: 1,2 (embed: its last step's; model: its first, then greedy)."
        ),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the inputs.")] = 0,
    weights_file: Annotated[
        Path | None,
        typer.Option(
            "--weights",
            help="A safetensors file (a subset is fine) or a checkpoint folder in the Hugging Face layout (shards "
            "and model.safetensors.index.json): each rank reads only its slice.",
        ),
    ] = None,
    weights_seed: Annotated[int, typer.Option("--weights-seed", help="Seed of the random weights.")] = 0,
    save_weights_to: Annotated[
        Path | None, typer.Option("--save-weights", help="Also save the weights the run used.")
    ] = None,
    backend: Annotated[
        Backend, typer.Option("--backend", help="reference (PyTorch) or triton (the kernels; interpreter on a CPU).")
    ] = Backend.reference,
    precision: Annotated[Precision, typer.Option("--precision", help="Reference compute dtype.")] = Precision.fp32,
    gpus: Annotated[
        int,
        typer.Option(
            "--gpus",
            min=1,
            help="Ranks in processes of their own (--backend triton): 1 is the one-device emulation (the default); "
            "T runs TP T on T GPUs, one rank each (on a CPU, T processes under the interpreter), and saves every "
            "rank's outputs.",
        ),
    ] = 1,
    cache: KernelCacheOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Summary as JSON on stdout.")] = False,
) -> None:
    """Run one launch kind and save every output and every write (plus its inputs) to a safetensors file."""
    import time

    # every check before the progress line and the heavy imports: a usage error costs no torch
    o = Output(as_json)
    spec = load_model(model)
    spec.check_tp(tp)
    for flag, path in (("--out", out), ("--save-weights", save_weights_to)):
        if path is not None:
            check_writable(flag, path)
    if rows not in ROW_COUNTS:
        raise UsageError(f"--rows {rows}: expected 1 to 8", hint="the row counts the kernels run")
    token_ids = parse_ids(tokens) if tokens is not None else None
    key = RunKey(kind, tp, rows, context, steps, seed, layer, token_ids)
    check_run_key(key)

    check_positions(spec, context, steps)
    if layer is not None:
        layer_for(spec, kind, layer)
    for t in token_ids or ():
        if not 0 <= t < spec.model.vocab_size:
            raise UsageError(f"token id {t} is out of range [0, {spec.model.vocab_size})")
    if backend is Backend.triton and precision is Precision.fp64:
        raise UsageError("--precision applies to the reference backend")
    if gpus > 1:
        _check_ranks(kind, tp, gpus, backend)

    import torch
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    num = FP64 if precision is Precision.fp64 else FP32
    _fits(spec, key, backend, num.dtype.itemsize, "cuda" if torch.cuda.is_available() else "cpu")
    weights = load_weights(weights_file, spec, partial=True) if weights_file else Weights(spec, weights_seed)
    what = f"{spec.name} {kind} TP{tp} rows {rows} context {context} steps {steps}"
    o.log(f"run {what} ({backend.value}, {precision.value if backend is Backend.reference else KERNEL_PRECISION})")
    t0 = time.perf_counter()
    counts = {}
    if backend is Backend.triton:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            # no GPU: the kernels run in Triton's interpreter (set before any kernel is defined)
            os.environ["TRITON_INTERPRET"] = "1"

        # the key resolved once (the tuned file, the grid for the device), what its lookup said printed once
        resolved = resolve_key(model, kind, tp, rows, None, device)
        for w in resolved.warnings:
            print_warning(w)
        if gpus > 1:
            # every rank its own weights, as this run's: the file's slice, or the seed's drawn as here (on the CPU)
            source = WeightsSource(weights_seed, "cpu", str(weights_file) if weights_file else None)
            o.log(f"on {gpus} real ranks ({device}), one process each")
            tensors = run_on_ranks(weights, resolved, key, source)
            # the outputs every rank has whole (a layer's state slices and caches are the rank's own: not compared)
            same = [n for n in tensors if n.startswith("ranks.") and _as_rank0(n) in tensors]
            apart = sorted(n for n in same if not torch.equal(tensors[n], tensors[_as_rank0(n)]))
            if apart:
                print_warning(f"on real ranks, rank outputs differ from rank 0's: {', '.join(apart)}")
            else:
                o.log("every rank's outputs bitwise equal to rank 0's (outputs.*; every rank's as ranks.<r>.*)")
        else:
            with counted_compiles(cache) as compiles, counting(resolved.name):
                tensors = run_triton(weights, key, resolved)
                counts = compiles()
        # the inputs as the reference run saves them (fp32), so two runs of one key compare input for input
        tensors = {n: t.float() if n.startswith("inputs.") and t.is_floating_point() else t for n, t in tensors.items()}
    else:
        tensors = run_reference(Reference(weights, tp, num), key)
    seconds = time.perf_counter() - t0
    metadata = {
        "glm53ctl": __version__,
        "model": spec.name,
        "kind": kind,
        "tp": str(tp),
        "rows": str(rows),
        "context": str(context),
        "steps": str(steps),
        "seed": str(seed),
        "layer": str(int(tensors["inputs.layer"])) if "inputs.layer" in tensors else "",
        "tokens": "" if tokens is None else tokens,
        "weights": str(weights_file) if weights_file else f"seeded:{weights_seed}",
        "backend": backend.value,
        "gpus": str(gpus),
        # what the numbers were computed in: the reference's dtype, or the kernels' own
        "precision": precision.value if backend is Backend.reference else KERNEL_PRECISION,
    }

    for path, write in (
        (out, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=metadata)),
        (save_weights_to, lambda tmp: save_weights(tmp, weights)),
    ):
        if path is None:
            continue
        try:
            write_atomic_with(path, write)
        except (OSError, SafetensorError) as e:
            raise UsageError(f"cannot write {path}: {e}") from None
    summary = []
    for name, t in tensors.items():
        finite = bool(torch.isfinite(t).all()) if t.is_floating_point() else True
        rms = float(t.double().pow(2).mean().sqrt()) if t.is_floating_point() and t.numel() else None
        summary.append(
            {
                "tensor": name,
                "shape": list(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "rms": rms,
                "finite": finite,
            }
        )
    kernels = {n: c.as_dict() for n, c in counts.items()}
    o.json(
        {"out": str(out), "seconds": round(seconds, 3), "metadata": metadata, "tensors": summary, "kernels": kernels}
    )
    o.table(
        f"{out} — {spec.name} {kind} TP{tp} rows {rows} ({seconds:.2f} s)",
        ["tensor", "shape", "dtype", "rms", "finite"],
        [
            (
                s["tensor"],
                "×".join(map(str, s["shape"])),
                s["dtype"],
                "" if s["rms"] is None else f"{s['rms']:.4g}",
                "yes" if s["finite"] else "NO",
            )
            for s in summary
        ],
    )
    print_kernels(o, counts)


def _as_rank0(name: str) -> str:
    """ranks.<r>.<output> -> outputs.<output>: what rank 0 saved of it."""
    return "outputs." + name.split(".", 2)[2]


def _check_ranks(kind: str, tp: int, gpus: int, backend: Backend) -> None:
    """--gpus T: the kernels (the reference has no ranks), at TP T, of a kind that runs on real ranks."""

    ranks_width(gpus)
    if backend is not Backend.triton:
        raise UsageError(f"--gpus {gpus}: real ranks run the kernels", hint="add --backend triton")
    if gpus != tp:
        raise UsageError(f"--gpus {gpus} runs TP{gpus}, one rank per GPU; --tp is {tp}", hint=f"add --tp {gpus}")
    runs = ranks_kinds()
    if kind not in runs:
        raise UsageError(
            f"--gpus {gpus}: {kind} does not run on real ranks yet",
            hint=f"the kinds whose runs do: {', '.join(runs)}; --gpus 1 runs {kind} on one device",
        )


def _fits(spec, key, backend: Backend, dtype_bytes: int, device: str) -> None:
    """Refuse a key whose reference prefill and caches (and, with the kernels on a GPU, the launch's caches)
    need more memory than there is, before any of it is allocated."""

    needs = run_needs(spec, key.kind, key.rows, key.context, key.steps, dtype_bytes)
    if backend is Backend.triton:
        needs += [
            n for n in launch_needs(spec, key.kind, key.rows, key.context, key.steps, device) if n.where != "host"
        ]
    check_fits(
        f"run --kind {key.kind} at context {key.context:,}",
        needs,
        device if backend is Backend.triton else "cpu",
        hint="a smaller --context or fewer --rows (check --context runs the launch at a context without a prefill)",
    )


def check_writable(flag: str, path: Path) -> None:
    """Refuse an output path before any work is done: a .safetensors file, and where one is there already, a
    safetensors file (a run replaces an earlier run's, never another kind of file that has the name)."""

    if path.suffix != ".safetensors":
        raise UsageError(f"{flag} {path}: expected a .safetensors file")
    check_replaceable(flag, path)
    if path.is_file() and not is_safetensors(path):
        raise UsageError(
            f"{flag} {path}: there is a file there that is not a safetensors file (left as it is)",
            hint="give a new path, or move that file away first",
        )


def is_safetensors(path: Path) -> bool:
    """A safetensors file's head: its header's length (8 bytes, little-endian), then that much JSON object."""
    import json

    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return False
            n = int.from_bytes(head, "little")
            if not 2 <= n <= 100_000_000:
                return False
            return isinstance(json.loads(f.read(n)), dict)
    except (OSError, ValueError):
        return False


def parse_ids(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise UsageError(f"--tokens {text!r}: expected comma-separated integers, e.g. 1,2") from None
