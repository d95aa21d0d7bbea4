"""Shared test helpers."""

from __future__ import annotations

import json
from pathlib import Path

from glm53ctl.cli import run_cli


def invoke(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process through its error boundary: (exit code, stdout, stderr)."""
    code = run_cli([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def invoke_json(capsys, *args: str) -> dict:
    code, out, err = invoke(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def assert_close(name: str, ref, out, bound: float) -> float:
    """Relative RMS error of `out` against `ref` within `bound`; NaN never passes."""
    import torch

    from glm53ctl.kernels.numerics import rel_rms

    assert ref.shape == out.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(ref).any(), f"{name}: NaN in the reference"
    err = rel_rms(ref, out)
    print(f"{name}: rel rms {err:.3e}, max abs {(out.double() - ref.double()).abs().max().item():.3e}")
    assert err <= bound, f"{name}: relative RMS error {err:.3e} > {bound:.1e}"
    return err


def bits(t):
    """A tensor's bit pattern (so -0 != +0 and NaN payloads count)."""
    import torch

    return t.contiguous().view({4: torch.int32, 2: torch.int16, 8: torch.int64, 1: torch.int8}[t.element_size()])


def assert_same_bits(a: dict, b: dict, what: str) -> None:
    """Every tensor of a and b equal bit for bit."""
    import torch

    assert a.keys() == b.keys(), what
    for n in a:
        assert torch.equal(bits(a[n]), bits(b[n])), f"{what}: {n} differs"


def assert_separate_launches_keep_bits(k, seed: int = 11) -> None:
    """A harness's separate-launches baseline (one launch per stage) gives its launch's bits."""
    x = k.inputs(seed=seed)[0]
    peers = k.peer_partials(x)
    base = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    assert_same_bits(base, k.separate()(x, peers, poison=True), "separate launches")


def first_site_of_each(table, types) -> dict:
    """Task type -> the first guarded wait (site index) of a task of that type in the table; every type has one."""
    sites = {}
    for i, s in enumerate(table.sites):
        ttype = table.tasks[s.task][0]
        if ttype in types and ttype not in sites:
            sites[ttype] = i
    assert len(sites) == len(types), f"no site of types {set(types) - set(sites)}"
    return sites


def resolved(kind: str, tp: int, rows: int, knobs: dict | None = None, device="cpu", context=None, model="tiny"):
    """A key resolved as a command resolves it (tuning/knobs.py `resolve_key`): what a harness is made from."""
    from glm53ctl.tuning.knobs import resolve_key

    return resolve_key(model, kind, tp, rows, knobs, device, context)
