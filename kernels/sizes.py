"""How big a key is before anything of it is allocated (issue 30): a `--context` past the model's positions, or one
whose caches (and, for `run`, whose reference prefill) need more memory than the machine has, is refused with
both figures, instead of dying in an allocation of tens of GB (or looping in a task table sized for 1e11 tokens).

Pure Python (no torch): the estimates are the sizes of the biggest tensors, not a profile; they are lower bounds
of what the work allocates, so a refusal is never wrong by more than what was left out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from glm53ctl.errors import UsageError
from glm53ctl.kernels.kinds import get_kind
from glm53ctl.kernels.spec import ModelSpec


@dataclass(frozen=True)
class Need:
    what: str  # "the DSA caches of 11 layers", ...
    bytes: int
    where: str  # "host" or "device"


def check_positions(spec: ModelSpec, context: int, steps: int = 1, flag: str = "--context") -> None:
    """The last position a key's steps reach, within the model's max_position_embeddings."""
    limit = spec.model.max_position_embeddings
    if limit is not None and context + steps > limit:
        most = limit - steps
        step = f"{steps} steps" if steps != 1 else "a step"
        raise UsageError(
            f"{flag} {context}: {step} after it take{'' if steps != 1 else 's'} {context + steps:,} positions, "
            f"past {spec.name}'s max_position_embeddings ({limit:,})",
            hint=f"{flag} {most} at most" + (f" with {steps} steps" if steps > 1 else ""),
        )


def dsa_layers(spec: ModelSpec, kind: str) -> int:
    """The DSA layers whose caches a key of `kind` holds: a step's every one, a layer kind's one, else none."""

    k = get_kind(kind)
    if k.composite:
        return sum(1 for attn, _ in spec.layers if attn == "dsa")
    return 1 if k.layer is not None and k.layer[0] == "dsa" else 0


def slots(spec: ModelSpec, context: int, steps: int) -> int:
    """Cache slots per row: whole pools for the longest row's context and the steps (kernels/reference.py `room`,
    which needs torch)."""
    kp = spec.indexer.kpool
    return max(-(-(context + steps) // kp) * kp, kp)


def cache_elems_per_slot(spec: ModelSpec) -> int:
    """A DSA cache slot's elements: the latent, the indexer's key and gate, a share of a pooled key."""
    ix = spec.indexer
    return spec.mla.kv_lora_rank + 2 * ix.head_dim + ix.head_dim // ix.kpool


def launch_needs(spec: ModelSpec, kind: str, rows: int, context: int, steps: int, device: str) -> list[Need]:
    """`check`, `fault`, `bench`, `tune`: the launch's caches on the device (bf16, a copy for the writes) and the
    reference's on the host (fp32, the state before and after)."""
    n = dsa_layers(spec, kind)
    if not n:
        return []
    cells = rows * slots(spec, context, steps) * cache_elems_per_slot(spec) * n
    where = f"the DSA caches of {n} layer{'s' if n != 1 else ''} at {rows} row{'s' if rows != 1 else ''}"
    return [
        Need(f"{where} (bf16, twice)", cells * 2 * 2, device),
        Need(f"{where} (fp32, twice)", cells * 4 * 2, "host"),
    ]


def run_needs(spec: ModelSpec, kind: str, rows: int, context: int, steps: int, dtype_bytes: int) -> list[Need]:
    """`run`: the reference's caches (its dtype, the state before and after) and the prefill of the longest row,
    which holds every token's index scores against every pool ([T, heads, T/kpool]) and its keys and values
    expanded per head; a KDA layer's prefill holds its projections of every token."""

    k = get_kind(kind)
    if k.layer is None and not k.composite or context == 0:
        return []
    needs = []
    n = dsa_layers(spec, kind)
    if n:
        cells = rows * slots(spec, context, steps) * cache_elems_per_slot(spec) * n
        needs.append(Need(f"the DSA caches of {n} layer{'s' if n != 1 else ''}", cells * dtype_bytes * 2, "host"))
        ix, mla, T = spec.indexer, spec.mla, context
        scores = T * ix.heads * (T // ix.kpool) * dtype_bytes
        kv = T * mla.heads * (mla.qk_nope_head_dim + mla.v_head_dim) * dtype_bytes
        needs.append(Need(f"the prefill of a {T:,}-token row (its index scores, keys and values)", scores + kv, "host"))
    elif k.layer is not None:  # a KDA layer: its prefill's inputs and projections per token
        P = spec.kda.heads * spec.kda.head_dim
        needs.append(
            Need(f"the prefill of a {context:,}-token row", context * (spec.hidden + 5 * P) * dtype_bytes, "host")
        )
    return needs


def host_available() -> int:
    """The host memory a process can take now: MemAvailable (Linux), else the physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def device_available(device: str) -> int:
    """Free memory of the device the launches run on (the host's for the interpreter)."""
    if device == "cpu":
        return host_available()
    import torch

    return torch.cuda.mem_get_info()[0]


def gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def check_fits(what: str, needs: list[Need], device: str, hint: str) -> None:
    """Refuse `what` where its needs pass what the host or the device has free, naming both. On a CPU the device
    is the host: both add up there."""
    places = {"host": host_available()}
    if device != "cpu":
        places[device] = device_available(device)
    for place, have in places.items():
        mine = [n for n in needs if n.where == place or device == "cpu"]
        total = sum(n.bytes for n in mine)
        if total > have:
            parts = "; ".join(f"{n.what}: {gb(n.bytes)}" for n in mine)
            name = "this machine" if place == "host" else f"the GPU ({place})"
            raise UsageError(f"{what} needs {gb(total)} ({parts}); {name} has {gb(have)} free", hint=hint)
