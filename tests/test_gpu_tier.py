"""The GPU tier asked for (`-m gpu`, or tests/gpu alone) runs or fails: it never passes by skipping. An ordinary
run (the CPU tier's `python -m pytest -q -n auto`) still skips the gpu tests where there is no GPU
(tests/conftest.py)."""

import os
import subprocess
import sys

import pytest

from tests import conftest

pytest_plugins = ("pytester",)

ROOT = conftest.GPU_TESTS.parent.parent
# a tier's worth of gpu tests, each a way one can fail to run
TIER = """
import pytest

pytestmark = pytest.mark.gpu


def test_runs():
    pass


def test_skips_inside():
    pytest.skip("no fla-core here")


def test_imports_or_skips():
    pytest.importorskip("no_such_module_anywhere")


@pytest.mark.skipif(True, reason="the GPU tier runs compiled kernels")
def test_skipped_by_its_mark():
    pass


@pytest.mark.xfail(reason="a known failure, not a skip")
def test_known_to_fail():
    assert False
"""


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess:
    """pytest in this checkout as one runs it, CUDA hidden (so a GPU machine says what a CPU machine does)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=os.environ | {"CUDA_VISIBLE_DEVICES": ""} | env,
    )


@pytest.mark.parametrize(
    ("args", "asked"),
    [
        (["-m", "gpu"], "-m gpu"),
        (["-m", "gpu and not slow"], "-m 'gpu and not slow'"),
        (["tests/gpu"], "tests/gpu"),
        (["tests/gpu/test_bits.py", "-n", "2"], "tests/gpu"),
    ],
    ids=["-m gpu", "-m expr", "tests/gpu", "a file of it, xdist"],
)
def test_the_gpu_tier_asked_for_where_it_cannot_run_fails(args, asked):
    p = _pytest(*args, TRITON_INTERPRET="0")
    assert p.returncode == pytest.ExitCode.USAGE_ERROR, p.stdout + p.stderr
    assert (
        f"ERROR: the GPU tier was asked for ({asked}) but cannot run here: torch " in p.stderr
        and " sees no CUDA device. On a GPU machine: TRITON_INTERPRET=0 python -m pytest -q -m gpu" in p.stderr
    ), p.stderr


def test_the_gpu_tier_under_the_interpreter_cannot_run():
    """tests/conftest.py's default, for the CPU tier: the GPU tier runs compiled kernels (both reasons at once)."""
    p = _pytest("-m", "gpu", TRITON_INTERPRET="1")
    assert p.returncode == pytest.ExitCode.USAGE_ERROR
    assert "sees no CUDA device; TRITON_INTERPRET=1 (tests/conftest.py's default, for the CPU tier)" in p.stderr


@pytest.fixture
def tier(pytester, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: needs a CUDA GPU\n")
    pytester.makepyfile(test_tier=TIER)
    return pytester


def test_an_ordinary_run_skips_the_gpu_tests_without_a_gpu(tier):
    for args in ((), ("-m", "not slow")):
        tier.runpytest_inprocess("-p", "tests.conftest", *args).assert_outcomes(skipped=5)


def test_a_gpu_test_that_skips_fails_the_tier_asked_for(tier, monkeypatch):
    """Past the session's own check (as on a GPU machine): every skip of a gpu test is a failure, in the test
    (pytest.skip, importorskip: failed) or in its setup (a skipif mark: an error); an xfail stays one."""
    monkeypatch.setattr(conftest, "gpu_tier_blockers", lambda: [])
    got = tier.runpytest_inprocess("-p", "tests.conftest", "-m", "gpu")
    got.assert_outcomes(passed=1, failed=2, errors=1, xfailed=1)
    for why in (
        "no fla-core here",
        "could not import 'no_such_module_anywhere'*",
        "the GPU tier runs compiled kernels",
    ):
        got.stdout.fnmatch_lines([f"the GPU tier was asked for (-m gpu), and this gpu test skipped: {why}"])
