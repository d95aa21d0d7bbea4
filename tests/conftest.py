import os

# The CPU tier runs every Triton kernel in the interpreter; set before triton is imported anywhere.
os.environ.setdefault("TRITON_INTERPRET", "1")

import shlex  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

GPU_TESTS = Path(__file__).resolve().parent / "gpu"
ASKED = pytest.StashKey[str | None]()


def gpu_tier_asked(config) -> str | None:
    """How the GPU tier was asked for, if it was: a mark expression that selects `gpu` tests and no unmarked ones
    (`-m gpu`, `-m "gpu and not slow"`), or paths in tests/gpu alone. None for an ordinary run (the CPU tier's
    `python -m pytest -q -n auto`, `-m "not slow"`), which skips the gpu tests where there is no GPU."""
    from _pytest.mark.expression import Expression  # -m as pytest itself reads it

    if config.option.markexpr:
        expr = Expression.compile(config.option.markexpr)
        if expr.evaluate(lambda name, **_: name == "gpu") and not expr.evaluate(lambda name, **_: False):
            return f"-m {shlex.quote(config.option.markexpr)}"
    paths = [Path(config.invocation_params.dir, a.split("::")[0]).resolve() for a in config.args]
    if paths and all(p.is_relative_to(GPU_TESTS) for p in paths):
        return "tests/gpu"
    return None


def gpu_tier_blockers() -> list[str]:
    """What keeps the GPU tier from running here."""
    import torch

    why = []
    if not torch.cuda.is_available():
        why.append(f"torch {torch.__version__} sees no CUDA device")
    if os.environ.get("TRITON_INTERPRET") == "1":
        why.append(
            "TRITON_INTERPRET=1 (tests/conftest.py's default, for the CPU tier) and the tier runs compiled kernels"
        )
    return why


def pytest_configure(config):
    config.stash[ASKED] = asked = gpu_tier_asked(config)
    if asked and not config.option.collectonly:
        # asked for, a tier that cannot run fails: skipped, it would pass with nothing proven
        why = gpu_tier_blockers()
        if why:
            raise pytest.UsageError(
                f"the GPU tier was asked for ({asked}) but cannot run here: {'; '.join(why)}. "
                "On a GPU machine: TRITON_INTERPRET=0 python -m pytest -q -m gpu"
            )


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available() or config.stash[ASKED]:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """With the GPU tier asked for, a gpu test that skips (a skipif, a pytest.skip or importorskip inside it)
    fails instead: the tier did not run it."""
    report = yield
    asked = item.config.stash[ASKED]
    if asked and report.skipped and not hasattr(report, "wasxfail") and "gpu" in item.keywords:
        why = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (
            f"the GPU tier was asked for ({asked}), and this gpu test skipped: {why.removeprefix('Skipped: ')}"
        )
    return report


ROOT = Path(__file__).resolve().parents[1]
# what a test run must not leave in the checkout (issue 30: the tests left build/tune/ behind): the default places
# of tune's studies and of build's outputs, relative to the folder a command runs in
LEFT_BEHIND = ("build/tune", "build/tune/studies.db")


@pytest.fixture(autouse=True)
def leaves_no_build_folder():
    """Each test leaves the checkout's build/ as it found it: a test that runs tune or build gives it a tmp_path
    (--storage, -o) or runs it in one (monkeypatch.chdir)."""
    before = {p for p in LEFT_BEHIND if (ROOT / p).exists()}
    yield
    made = [p for p in LEFT_BEHIND if (ROOT / p).exists() and p not in before]
    if made:
        pytest.fail(f"the test left {', '.join(made)} in the checkout ({ROOT}); run it in a tmp_path")


@pytest.fixture(autouse=True)
def forgets_models_loaded_by_path(monkeypatch):
    """A model loaded by its .toml's path is known by name for the rest of the process (kernels/spec.py
    `load_model`, through $GLM53CTL_MODEL_FILES, so that workers find it): each test starts with the models the
    process started with, whichever tests ran before it in its worker (`configs show` listed another test's 'odd')."""
    from glm53ctl.kernels.spec import MODEL_FILES_ENV

    monkeypatch.setenv(MODEL_FILES_ENV, os.environ.get(MODEL_FILES_ENV, ""))
