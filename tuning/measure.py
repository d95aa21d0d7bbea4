"""Measuring on the GPU, and deciding from the measurements (docs/design.md §8): what `glm53ctl bench` and
`glm53ctl tune` are built on.

- µs per launch: `graph_time` replays a CUDA graph of `inner` launches `rounds` times; `rotations` says how
  many weight copies the caller rotates over so that each launch streams its weights from HBM, not the L2.
- The floor: `copy_bandwidth` (the faster of two elementwise copies, torch's and a Triton one: `copy_`, a
  cudaMemcpy, moves only ~2.7 TB/s on the H200, docs/design.md §4) and `floor_us`.
- A against B: `ab_rounds` takes samples in A B B A order, so a drift (clocks, heat) cancels within each round;
  `ratio` gives B/A (below 1: B is faster) with a bootstrap interval; a same-against-same run's `spread` sets
  the keep threshold δ (`keep_threshold`); `verdict` says whether B is faster, slower or within noise.
- What was measured, and where: `environment` (exactly the tuned files' Provenance) and `code_digest`.

On a GPU, B against A, after a same-against-same run of A has set δ:

    warm_clocks()
    same = ratio(*ab_rounds(graph_timer(run_a), graph_timer(run_a), rounds=25))
    delta = keep_threshold(spread(same))
    b_vs_a = ratio(*ab_rounds(graph_timer(run_a), graph_timer(run_b), rounds=25))
    verdict(b_vs_a["ratio_ci"], delta)  # "faster": B's upper bound is below 1 - δ, the keep rule

Importing this module needs no GPU; the functions that measure raise `NeedsGPU` without one.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
import triton
import triton.language as tl

from glm53ctl import __version__
from glm53ctl.errors import Glm53Error
from glm53ctl.kernels.weights import L2_BYTES  # noqa: F401 - the rotations' L2, defined where a step's weights read it

# the floor of the keep threshold: δ = max(1%, 2 × the spread of a same-against-same run) (docs/design.md §8)
MIN_DELTA = 0.01
# the Triton copy (benchmarks/runtime_gpu.py up to git f418783 had it): 4.08-4.11 TB/s on the H200, 16K blocks
# or 4 warps no faster (2026-12-01)
COPY_BLOCK, COPY_WARPS = 8192, 8
# the sources whose content says "the same code was timed" (code_digest)
CODE_FOLDERS = ("kernels", "tuning")

Verdict = Literal["faster", "slower", "within noise"]


class NeedsGPU(Glm53Error):
    """A GPU measurement asked for where torch sees no CUDA device."""


def _need_cuda(what: str) -> None:
    if not torch.cuda.is_available():
        raise NeedsGPU(f"{what} needs a CUDA GPU; torch {torch.__version__} sees none", hint="run it on a GPU machine")


# µs per launch


class GraphTiming(NamedTuple):
    median_us: float  # µs per launch, the median over rounds
    rounds_us: list[float]  # µs per launch of each round (one replay of the graph), in the order replayed


def capture_graph(fn: Callable[[], object], inner: int = 20) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `inner` calls of fn. One call runs first on a side stream (Triton compiles, the allocator
    settles: neither may happen inside a capture) and the graph is replayed once (its first replay uploads it)."""
    _need_cuda("capture_graph")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def graph_timer(fn: Callable[[], object], inner: int = 20) -> Callable[[], float]:
    """Captures `inner` calls of fn once; each call of the result replays them and returns µs per launch. Events
    around a replay time the GPU alone, without the host's launch cost (a decode step runs captured too)."""
    _need_cuda("graph_timer")
    graph = capture_graph(fn, inner)

    def replay_us() -> float:
        # fn holds what the graph reads (a launch's weight copies, its inputs): while the timer lives, so must
        # they, or the caching allocator hands their memory to the next tensor and the graph reads that
        _ = fn
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000 / inner

    return replay_us


def graph_time(fn: Callable[[], object], inner: int = 20, rounds: int = 21) -> GraphTiming:
    """µs per launch of fn: a CUDA graph of `inner` launches replayed `rounds` times; the median over rounds,
    since a round that a clock dip or a host hiccup hits is an outlier, not part of the launch's time."""
    _need_cuda("graph_time")
    timer = graph_timer(fn, inner)
    rounds_us = [timer() for _ in range(rounds)]
    return GraphTiming(statistics.median(rounds_us), rounds_us)


def rotations(nbytes_per_launch: int, l2_bytes: int = L2_BYTES, at_least: int = 2, margin: float = 2.0) -> int:
    """How many weight copies to rotate over so that every launch reads its weights from HBM, not from the L2.

    With k copies used in turn, the k - 1 launches between two uses of one copy stream (k - 1) × nbytes; that
    must be well past the L2 (`margin` times its size, since the L2 does not evict in strict LRU order). At
    least `at_least` copies, so back-to-back launches never share one. Keep graph_time's `inner` a multiple of
    the copies, or the wrap from one replay to the next brings a copy back sooner.
    """
    if nbytes_per_launch <= 0:
        raise ValueError(f"nbytes_per_launch must be positive, got {nbytes_per_launch}")
    return max(at_least, 1 + math.ceil(margin * l2_bytes / nbytes_per_launch))


# the copy-bandwidth floor


@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    o_n = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < n
    tl.store(dst + o_n, tl.load(src + o_n, mask=m_n), mask=m_n)


def kernel_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst = src through copy_kernel (contiguous tensors of one dtype and size)."""
    assert src.is_contiguous() and dst.is_contiguous(), "kernel_copy: contiguous tensors only"
    assert src.dtype == dst.dtype and src.numel() == dst.numel(), "kernel_copy: one dtype and size"
    n = src.numel()
    copy_kernel[(triton.cdiv(n, COPY_BLOCK),)](
        src,
        dst,
        n,
        BLOCK=COPY_BLOCK,
        num_warps=COPY_WARPS,
    )


def copy_bandwidth(nbytes: int = 2 * 2**30, inner: int = 5, rounds: int = 15) -> float:
    """TB/s moved from device memory to device memory (bytes read + written), the median over graph rounds, by
    the faster of two elementwise copies: what a launch's floor is measured against. On the H200 torch's
    (`torch.mul(src, 1, out=dst)`) moves 4.28-4.29 TB/s, copy_kernel 4.08-4.11 (2026-12-01); docs/perf's floors
    use the faster. copy_kernel is left out where Triton interprets. The default 2 GiB is far past the L2."""
    _need_cuda("copy_bandwidth")
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ways = [lambda: torch.mul(src, 1, out=dst)]
    if isinstance(copy_kernel, triton.runtime.JITFunction):
        ways.append(lambda: kernel_copy(src, dst))
    us = min(graph_time(way, inner=inner, rounds=rounds).median_us for way in ways)
    return 2 * src.numel() * src.element_size() / (us * 1e-6) / 1e12


def floor_us(nbytes: float, tb_s: float) -> float:
    """µs to move `nbytes` at `tb_s` TB/s: a launch's floor at the measured copy bandwidth."""
    if tb_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {tb_s} TB/s")
    return nbytes / (tb_s * 1e12) * 1e6


def warm_clocks(seconds: float = 1.5) -> None:
    """The SM clock idles low and takes a while to rise: bf16 matmuls for `seconds` before anything is timed
    (synchronized each time, so the work ends when the time does)."""
    _need_cuda("warm_clocks")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.matmul(a, a, out=out)
        torch.cuda.synchronize()


# what was measured, and where


def _tree_root() -> Path:
    """The folder holding this tree's kernels/ and tuning/: a checkout's root, or an installed glm53ctl/."""
    return Path(__file__).resolve().parent.parent


def git_state(root: Path) -> tuple[str, bool]:
    """(sha, dirty) of the git checkout whose top folder is root; dirty: a tracked file differs from HEAD
    (untracked files are ignored, as by `git describe --dirty`). ("unknown", True) where root is no checkout's top
    (an installed copy): nothing vouches that such code matches any commit."""
    # the checkout at root, whatever a caller's git environment (a hook's GIT_DIR) points at
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")}

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        # --no-optional-locks: a read, so it never takes the index lock from the user's own git
        cmd = ["git", "--no-optional-locks", *args]
        return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=60)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return "unknown", True
        head = git("rev-parse", "--verify", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", True
    if head.returncode:
        return "unknown", True
    return head.stdout.strip(), status.returncode != 0 or bool(status.stdout.strip())


def tree_state(root: Path | None = None) -> tuple[str, bool]:
    """(sha, dirty) of the tree this code runs from (or `root`), GIT_SHA and GIT_DIRTY=0/1 overriding what its
    git says (a device machine's copy of the tree may carry a stale .git)."""
    sha, dirty = git_state(root or _tree_root())
    sha = os.environ.get("GIT_SHA") or sha
    dirty = os.environ["GIT_DIRTY"] == "1" if os.environ.get("GIT_DIRTY") in ("0", "1") else dirty
    return sha, dirty


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def environment(command: str, study: str | None = None, seed: int | None = None) -> dict[str, Any]:
    """Where numbers are measured, with exactly the fields of the tuned files' Provenance (glm53ctl.tuned), so
    `Provenance(**environment(...))` validates. `command` is the exact command line that measured.

    The git sha and dirty flag are those of the checkout this code runs from; GIT_SHA (and GIT_DIRTY=0/1) name
    the commit where that checkout's own .git cannot (a device machine's copy of the tree may carry a stale one).
    Without a GPU the GPU fields read "cpu", "0.0" and "none", so it runs anywhere.
    """
    sha, dirty = tree_state()
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu_name, capability, driver = props.name, f"{props.major}.{props.minor}", _driver_version()
    else:
        gpu_name, capability, driver = "cpu", "0.0", "none"
    return {
        "glm53ctl": __version__,
        "git_sha": sha,
        "git_dirty": dirty,
        "gpu_name": gpu_name,
        "gpu_capability": capability,
        "driver": driver,
        "cuda": torch.version.cuda or "none",
        "torch": str(torch.__version__),
        "triton": triton.__version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command,
        "study": study,
        "seed": seed,
    }


def code_digest(root: Path | None = None, folders: tuple[str, ...] = CODE_FOLDERS) -> str:
    """16 hex digits of a sha256 over the kernel and tuning sources (kernels/**/*.py and tuning/**/*.py under
    root; by default the tree this code runs from): each file's path relative to root and its content, in sorted
    path order. The same code gives the same digest in any checkout or copy, whatever its git says, so two runs
    can show they timed the same code."""
    root = Path(root) if root is not None else _tree_root()
    files = sorted((p.relative_to(root).as_posix(), p) for folder in folders for p in (root / folder).rglob("*.py"))
    if not files:
        raise ValueError(f"{root}: no {' or '.join(f'{f}/*.py' for f in folders)} to digest")
    digest = hashlib.sha256()
    for rel, path in files:
        data = path.read_bytes()
        # lengths keep the boundaries: content moved from one file to the next changes the digest
        digest.update(f"{rel}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


# A against B


class ABSamples(NamedTuple):
    a: list[float]  # A's µs, two a round: round i's are a[2i] (before B's pair) and a[2i + 1] (after it)
    b: list[float]  # B's µs, two a round: b[2i] and b[2i + 1], taken between A's two


def ab_rounds(time_a: Callable[[], float], time_b: Callable[[], float], rounds: int = 25) -> ABSamples:
    """`rounds` rounds of A B B A, each call of time_a / time_b one sample (µs; a `graph_timer` on a GPU). A's
    samples sit at a round's ends and B's in its middle, so both sides' samples have the same mean time: a drift
    that is linear over a round (clocks, heat, a neighbour's load) adds the same to both and cancels in its ratio."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    a: list[float] = []
    b: list[float] = []
    for _ in range(rounds):
        a.append(time_a())
        b.append(time_b())
        b.append(time_b())
        a.append(time_a())
    return ABSamples(a, b)


def ratio(
    samples_a: Sequence[float],
    samples_b: Sequence[float],
    *,
    per_round: int | None = 2,
    n_boot: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """B against A: the median ratio B/A (below 1: B is faster; above 1: B is slower) and its bootstrap interval.

    Paired (per_round: the samples each side took per round, 2 for `ab_rounds`): a round's ratio is the sum of
    B's samples in it over the sum of A's; the ratio is the median over rounds; the bootstrap resamples whole
    rounds, so a drift from round to round stays out of the interval. per_round=None: unpaired samples (two
    separate runs): the ratio of the two medians, each side resampled on its own. Deterministic for a seed.

    Returns a_us and b_us (each side's median), ratio, ratio_ci (low, high) at `confidence`, confidence,
    rounds (None when unpaired) and samples (both sides together).
    """
    a, b = np.asarray(samples_a, dtype=np.float64), np.asarray(samples_b, dtype=np.float64)
    if a.size == 0 or b.size == 0:
        raise ValueError("ratio needs samples of both A and B")
    if not (np.isfinite(a).all() and np.isfinite(b).all() and (a > 0).all() and (b > 0).all()):
        raise ValueError("ratio needs positive, finite times")
    if not 0 < confidence < 1 or n_boot < 1:
        raise ValueError(f"need 0 < confidence < 1 and n_boot >= 1, got {confidence} and {n_boot}")
    rng = np.random.default_rng(seed)
    if per_round is not None:
        if a.size != b.size or a.size % per_round:
            raise ValueError(f"paired samples need equal counts, {per_round} a round: got {a.size} A, {b.size} B")
        rounds = a.size // per_round
        per_round_ratio = b.reshape(rounds, per_round).sum(1) / a.reshape(rounds, per_round).sum(1)
        middle = float(np.median(per_round_ratio))
        boot = np.median(per_round_ratio[rng.integers(0, rounds, (n_boot, rounds))], axis=1)
    else:
        rounds = None
        middle = float(np.median(b) / np.median(a))
        boot_a = np.median(a[rng.integers(0, a.size, (n_boot, a.size))], axis=1)
        boot_b = np.median(b[rng.integers(0, b.size, (n_boot, b.size))], axis=1)
        boot = boot_b / boot_a
    low, high = np.quantile(boot, [(1 - confidence) / 2, (1 + confidence) / 2])
    return {
        "a_us": float(np.median(a)),
        "b_us": float(np.median(b)),
        "ratio": middle,
        "ratio_ci": (float(low), float(high)),
        "confidence": confidence,
        "rounds": rounds,
        "samples": int(a.size + b.size),
    }


def spread(same_against_same: dict[str, Any]) -> float:
    """How far a same-against-same run's interval (a `ratio` result) reaches from 1 on either side: the noise of
    this measurement, which a real difference must clear."""
    low, high = same_against_same["ratio_ci"]
    return max(abs(1 - low), abs(high - 1))


def keep_threshold(same_spread: float) -> float:
    """δ = max(1%, 2 × the spread of a same-against-same run) (docs/design.md §8)."""
    return max(MIN_DELTA, 2 * same_spread)


def verdict(ratio_ci: tuple[float, float], delta: float) -> Verdict:
    """B against A from the interval of B/A: "faster" where its upper bound is below 1 - δ (the keep rule, as
    glm53ctl.tuned.Evidence states it), "slower" where its lower bound is above 1 + δ, else "within noise"."""
    low, high = ratio_ci
    if high < 1 - delta:
        return "faster"
    if low > 1 + delta:
        return "slower"
    return "within noise"
