"""glm53ctl.tuning.measure: the A-B statistics against synthetic timers whose true ratio and drift are known, the
environment record against Provenance, the code digest on a tmp tree; the GPU functions on a GPU (marked gpu)
and, on a CPU, that they refuse clearly."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time

import pytest
import torch

from glm53ctl.errors import Glm53Error
from glm53ctl.tuning import measure
from glm53ctl.tuning.measure import (
    L2_BYTES,
    NeedsGPU,
    ab_rounds,
    code_digest,
    environment,
    floor_us,
    git_state,
    keep_threshold,
    ratio,
    rotations,
    spread,
    verdict,
)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="what happens without a CUDA device")


class Drifting:
    """Two timers on one clock. Each call is one tick; a sample is its side's true µs × (1 + drift × tick) × seeded
    lognormal noise: a slow drift (clocks sagging as the GPU heats) large next to the differences measured."""

    def __init__(self, a_us, b_us, drift=0.002, noise=0.01, seed=0):
        self.a_us, self.b_us, self.drift, self.noise = a_us, b_us, drift, noise
        self.rng = random.Random(seed)
        self.tick = 0
        self.calls = []

    def _sample(self, side, us):
        self.calls.append(side)
        self.tick += 1
        return us * (1 + self.drift * self.tick) * self.rng.lognormvariate(0, self.noise)

    def a(self):
        return self._sample("A", self.a_us)

    def b(self):
        return self._sample("B", self.b_us)


def ab(a_us, b_us, rounds=40, seed=0, **kw):
    t = Drifting(a_us, b_us, seed=seed, **kw)
    return ratio(*ab_rounds(t.a, t.b, rounds), seed=seed)


# A against B


def test_ab_rounds_alternate_a_b_b_a():
    t = Drifting(100.0, 100.0, noise=0.0)
    a, b = ab_rounds(t.a, t.b, rounds=3)
    assert "".join(t.calls) == "ABBA" * 3
    # the samples keep the order taken: round i's A at its ticks 1 and 4, B at 2 and 3
    assert a == pytest.approx([100 * (1 + 0.002 * k) for k in (1, 4, 5, 8, 9, 12)])
    assert b == pytest.approx([100 * (1 + 0.002 * k) for k in (2, 3, 6, 7, 10, 11)])


def test_the_ratio_lands_on_the_true_ratio_despite_drift():
    t = Drifting(100.0, 110.0, seed=1)
    samples = ab_rounds(t.a, t.b, rounds=40)
    got = ratio(*samples, seed=1)
    assert got["ratio"] == pytest.approx(1.10, abs=0.005)
    assert got["ratio_ci"][0] < 1.10 < got["ratio_ci"][1]
    assert got["rounds"] == 40 and got["samples"] == 160
    assert got["b_us"] / got["a_us"] == pytest.approx(1.10, abs=0.02)
    # the drift is real: all of A, then all of B, misses by far more than the A B B A ratio does
    later = Drifting(100.0, 110.0, seed=1)
    a_first = [later.a() for _ in range(80)]
    b_after = [later.b() for _ in range(80)]
    assert ratio(a_first, b_after, per_round=None)["ratio"] > 1.10 * 1.10
    # and pairing by round keeps it out of the interval: unpaired, the same samples give a far wider one
    unpaired = ratio(*samples, per_round=None, seed=1)["ratio_ci"]
    assert got["ratio_ci"][1] - got["ratio_ci"][0] < (unpaired[1] - unpaired[0]) / 3


@pytest.mark.parametrize("true", [0.8, 0.97, 1.0, 1.25])
def test_the_interval_holds_the_true_ratio(true):
    got = ab(100.0, 100.0 * true, seed=2)
    assert got["ratio_ci"][0] <= true <= got["ratio_ci"][1]
    assert got["ratio_ci"][1] - got["ratio_ci"][0] < 0.02


def test_same_against_same_is_within_noise():
    first = ab(50.0, 50.0, seed=3)
    assert first["ratio_ci"][0] < 1 < first["ratio_ci"][1]
    delta = keep_threshold(spread(first))
    # a second same-against-same run, judged by the first's δ
    again = ab(50.0, 50.0, seed=4)
    assert verdict(again["ratio_ci"], delta) == "within noise"


def test_ten_percent_slower_is_slower_and_ten_percent_faster_is_faster():
    delta = keep_threshold(spread(ab(100.0, 100.0, seed=5)))
    assert delta == pytest.approx(0.01)  # this timer's noise is small: the 1% floor holds
    assert verdict(ab(100.0, 110.0, seed=6)["ratio_ci"], delta) == "slower"
    assert verdict(ab(100.0, 90.0, seed=7)["ratio_ci"], delta) == "faster"


def test_a_noisy_same_against_same_run_widens_delta():
    noisy = ab(100.0, 100.0, seed=8, noise=0.03)
    delta = keep_threshold(spread(noisy))
    assert delta == pytest.approx(2 * spread(noisy)) and delta > 0.03
    # 3% slower, measured quietly: slower by a quiet run's δ (1%), within the noisy run's
    three_percent = ab(100.0, 103.0, seed=9)["ratio_ci"]
    assert verdict(three_percent, keep_threshold(spread(ab(100.0, 100.0, seed=5)))) == "slower"
    assert verdict(three_percent, delta) == "within noise"
    # 10% clears even the noisy δ, measured as noisily
    assert verdict(ab(100.0, 110.0, seed=9, noise=0.03)["ratio_ci"], delta) == "slower"


def test_below_the_one_percent_floor_is_within_noise():
    got = ab(100.0, 99.5, seed=10, noise=0.002)["ratio_ci"]
    assert got[1] < 1  # significant, but smaller than δ = 1%
    assert verdict(got, keep_threshold(0.0)) == "within noise"


def test_the_bootstrap_is_deterministic_per_seed():
    t = Drifting(100.0, 104.0, seed=11)
    samples = ab_rounds(t.a, t.b, rounds=20)
    assert ratio(*samples, seed=3) == ratio(*samples, seed=3)
    assert ratio(*samples, seed=3)["ratio_ci"] != ratio(*samples, seed=4)["ratio_ci"]
    assert ratio(*samples, seed=3)["ratio"] == ratio(*samples, seed=4)["ratio"]  # the median is no resample


def test_ratio_refuses_what_it_cannot_pair_or_divide():
    with pytest.raises(ValueError, match="equal counts"):
        ratio([1.0, 2.0], [1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="equal counts"):
        ratio([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="positive"):
        ratio([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="confidence"):
        ratio([1.0, 1.0], [1.0, 1.0], confidence=1.0)
    with pytest.raises(ValueError, match="both"):
        ratio([], [1.0], per_round=None)


def test_spread_keep_threshold_and_verdict():
    assert spread({"ratio_ci": (0.98, 1.005)}) == pytest.approx(0.02)
    assert spread({"ratio_ci": (1.01, 1.03)}) == pytest.approx(0.03)  # an interval off 1 is noise too
    assert keep_threshold(0.001) == 0.01
    assert keep_threshold(0.02) == pytest.approx(0.04)
    assert verdict((0.90, 0.95), 0.04) == "faster"
    assert verdict((0.90, 0.97), 0.04) == "within noise"
    assert verdict((1.05, 1.10), 0.04) == "slower"
    assert verdict((1.03, 1.10), 0.04) == "within noise"


# rotations and the floor


def test_rotations_put_every_launch_well_past_the_l2():
    mb = 2**20
    assert rotations(120 * mb, l2_bytes=60 * mb) == 2  # one other launch streams 2× the L2
    assert rotations(100 * mb, l2_bytes=60 * mb) == 3
    assert rotations(10 * mb, l2_bytes=60 * mb) == 13
    assert rotations(4 * L2_BYTES) == 2  # never fewer than at_least
    assert rotations(4 * L2_BYTES, at_least=3) == 3
    for nbytes in (1, 5 * mb, 12_582_912, 41 * mb, 78_000_000, 119 * mb, 121 * mb):
        k = rotations(nbytes)
        assert (k - 1) * nbytes >= 2 * L2_BYTES  # past the L2 twice over
        assert k == 2 or (k - 2) * nbytes < 2 * L2_BYTES  # and no more copies than that needs
    with pytest.raises(ValueError):
        rotations(0)


def test_floor_us():
    assert floor_us(4.26e6, 4.26) == pytest.approx(1.0)
    assert floor_us(78e6, 4.26) == pytest.approx(18.31, abs=0.01)
    with pytest.raises(ValueError):
        floor_us(1e6, 0.0)


interpreted = not isinstance(measure.copy_kernel, measure.triton.runtime.JITFunction)


@pytest.mark.interpreter
@pytest.mark.skipif(not interpreted and not torch.cuda.is_available(), reason="compiled Triton needs a CUDA GPU")
def test_kernel_copy_copies_every_element():
    device = "cpu" if interpreted else "cuda"
    src = torch.randn(2 * measure.COPY_BLOCK + 5, device=device).to(torch.bfloat16)  # a partial last block
    dst = torch.full_like(src, float("nan"))
    measure.kernel_copy(src, dst)
    assert torch.equal(src, dst)


# what was measured, and where


def test_environment_validates_as_provenance():
    from glm53ctl.tuned import Provenance

    env = environment("glm53ctl tune --tp 4 --rows 2", study="s", seed=7)
    # strict, through JSON: as tune writes it and a tuned file is read back
    p = Provenance.model_validate_json(json.dumps(env), strict=True)
    assert set(env) == set(Provenance.model_fields)
    assert (p.command, p.study, p.seed) == ("glm53ctl tune --tp 4 --rows 2", "s", 7)
    assert p.torch == torch.__version__ and p.triton == measure.triton.__version__
    assert p.gpu_name == (torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    Provenance(**environment("glm53ctl bench"))


def test_environment_names_the_commit_given_in_the_environment(monkeypatch):
    monkeypatch.setenv("GIT_SHA", "0123abc")
    monkeypatch.setenv("GIT_DIRTY", "0")
    env = environment("x")
    assert (env["git_sha"], env["git_dirty"]) == ("0123abc", False)
    monkeypatch.setenv("GIT_DIRTY", "1")
    assert environment("x")["git_dirty"] is True


@no_cuda
def test_environment_without_a_gpu():
    env = environment("x")
    assert (env["gpu_name"], env["gpu_capability"], env["driver"]) == ("cpu", "0.0", "none")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_state_of_a_checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "kernels").mkdir(parents=True)
    (repo / "kernels" / "k.py").write_text("x = 1\n")

    def git(*args):
        ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
        return subprocess.run(["git", *ident, *args], cwd=repo, check=True, capture_output=True, text=True)

    assert git_state(repo) == ("unknown", True)  # no checkout at all
    git("init", "-q")
    assert git_state(repo) == ("unknown", True)  # no commit yet
    git("add", ".")
    git("commit", "-qm", "one")
    sha = git("rev-parse", "HEAD").stdout.strip()
    assert git_state(repo) == (sha, False)
    (repo / "notes.txt").write_text("untracked\n")
    assert git_state(repo) == (sha, False)
    (repo / "kernels" / "k.py").write_text("x = 2\n")
    assert git_state(repo) == (sha, True)
    # a folder inside a checkout is not that checkout's top (an installed copy inside a repo, say)
    assert git_state(repo / "kernels") == ("unknown", True)


def make_tree(root, files):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


TREE = {
    "kernels/ops/gemv/kernel.py": "def gemv(): ...\n",
    "kernels/kinds/dense/kernel.py": "def dense(): ...\n",
    "tuning/knobs.py": "KNOBS = {}\n",
    "kernels/ops/kda/README.md": "math\n",
    "glm53ctl/cli.py": "def main(): ...\n",
    "benchmarks/runtime_gpu.py": "print(1)\n",
}


def test_code_digest_follows_the_kernel_sources_only(tmp_path):
    root = make_tree(tmp_path / "a", TREE)
    first = code_digest(root)
    assert len(first) == 16 and int(first, 16) >= 0
    for unrelated in ("glm53ctl/cli.py", "benchmarks/runtime_gpu.py", "kernels/ops/kda/README.md"):
        (root / unrelated).write_text("changed\n")
        assert code_digest(root) == first, unrelated
    (root / "kernels/kinds/dense/kernel.py").write_text("def dense(): return 1\n")
    assert code_digest(root) != first
    (root / "kernels/kinds/dense/kernel.py").write_text(TREE["kernels/kinds/dense/kernel.py"])
    assert code_digest(root) == first
    (root / "tuning/knobs.py").write_text("KNOBS = {'grid': 0}\n")
    assert code_digest(root) != first


def test_code_digest_is_the_same_in_another_checkout(tmp_path, monkeypatch):
    first = code_digest(make_tree(tmp_path / "a", TREE))
    # another folder, the files written in the opposite order
    assert code_digest(make_tree(tmp_path / "b", dict(reversed(TREE.items())))) == first
    # another file system, which lists the files in another order
    rglob = type(tmp_path).rglob
    monkeypatch.setattr(type(tmp_path), "rglob", lambda self, pattern: reversed(sorted(rglob(self, pattern))))
    assert code_digest(tmp_path / "a") == first
    monkeypatch.undo()
    # a file renamed is other code
    moved = {**TREE, "kernels/ops/gemv/kernel2.py": TREE["kernels/ops/gemv/kernel.py"]}
    del moved["kernels/ops/gemv/kernel.py"]
    assert code_digest(make_tree(tmp_path / "c", moved)) != first
    # and one file whose text runs on into the next file's name is not those two files
    two = {"kernels/a.py": "x = 1\n", "kernels/b.py": "y = 2\n"}
    one = {"kernels/a.py": "x = 1\nkernels/b.pyy = 2\n"}
    assert code_digest(make_tree(tmp_path / "d", two)) != code_digest(make_tree(tmp_path / "e", one))


def test_code_digest_of_this_tree_and_of_nothing(tmp_path):
    assert code_digest() == code_digest(measure._tree_root())
    assert len(code_digest()) == 16
    with pytest.raises(ValueError, match="no kernels"):
        code_digest(make_tree(tmp_path, {"glm53ctl/cli.py": ""}))


# the GPU functions


@no_cuda
@pytest.mark.parametrize(
    "call",
    [
        lambda: measure.graph_time(lambda: None),
        lambda: measure.graph_timer(lambda: None),
        lambda: measure.capture_graph(lambda: None),
        lambda: measure.copy_bandwidth(),
        lambda: measure.warm_clocks(0.1),
    ],
    ids=["graph_time", "graph_timer", "capture_graph", "copy_bandwidth", "warm_clocks"],
)
def test_gpu_functions_refuse_clearly_without_a_gpu(call, request):
    name = request.node.callspec.id
    with pytest.raises(NeedsGPU, match=f"^{name} needs a CUDA GPU") as e:
        call()
    assert isinstance(e.value, Glm53Error) and e.value.hint  # the CLI's boundary prints it as Error: + Hint:


@pytest.mark.gpu
def test_graph_time_scales_with_the_bytes_moved():
    small = torch.empty(2**26, device="cuda", dtype=torch.bfloat16)  # 128 MiB, past the L2
    large = torch.empty(2**27, device="cuda", dtype=torch.bfloat16)
    out_small, out_large = torch.empty_like(small), torch.empty_like(large)
    t_small = measure.graph_time(lambda: out_small.copy_(small), inner=10, rounds=11)
    t_large = measure.graph_time(lambda: out_large.copy_(large), inner=10, rounds=11)
    assert len(t_small.rounds_us) == 11
    assert t_small.median_us == sorted(t_small.rounds_us)[5]
    assert 10 < t_small.median_us < 10_000
    assert 1.6 < t_large.median_us / t_small.median_us < 2.4


@pytest.mark.gpu
def test_graph_timers_in_a_b_b_a_rounds():
    x = torch.empty(2**26, device="cuda", dtype=torch.bfloat16)
    y, z = torch.empty_like(x), torch.empty(2**27, device="cuda", dtype=torch.bfloat16)
    z2 = torch.empty_like(z)
    got = ratio(*ab_rounds(measure.graph_timer(lambda: y.copy_(x)), measure.graph_timer(lambda: z2.copy_(z)), 10))
    assert 1.6 < got["ratio"] < 2.4 and verdict(got["ratio_ci"], 0.01) == "slower"


@pytest.mark.gpu
def test_copy_bandwidth_is_an_hbm_figure():
    tb_s = measure.copy_bandwidth(nbytes=2**30)
    assert 1.0 < tb_s < 10.0  # H200: 4.26-4.30 TB/s (docs/design.md §4)


@pytest.mark.gpu
def test_warm_clocks_runs_for_its_time():
    start = time.perf_counter()
    measure.warm_clocks(0.3)
    assert 0.3 <= time.perf_counter() - start < 5


@pytest.mark.gpu
def test_environment_on_a_gpu():
    env = environment("x")
    major, minor = torch.cuda.get_device_capability()
    assert env["gpu_capability"] == f"{major}.{minor}"
    assert env["cuda"] == torch.version.cuda and env["driver"] not in ("none", "unknown")
