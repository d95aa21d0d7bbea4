"""The kernel cache a CPU build carries to a GPU (kernels/kernel_cache.py): in a fresh process, Triton's own JIT
derives for a launch's real arguments the keys the build put its kernels under, and loads them instead of
compiling; a damaged entry is named and compiled, a cache of another Triton version is one warning and a compile.

The fresh processes run tests/kernels/jit_probe.py: Triton's JIT for an sm_90 target with no GPU (a driver that
knows its target only; each launch warmed up, not launched), over a harness's real arguments."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).with_name("jit_probe.py")
KEYS = ["embed:2:1", "tail:2:1"]
NAMES = ["tiny/embed/tp2/r1", "tiny/tail/tp2/r1"]
# each key's launch and its peer's: two kernels a key
KERNELS = 2


def _env(triton_cache: Path) -> dict:
    """A process as a user's: not under the interpreter, no cache or log of this run's, an empty Triton cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GLM53CTL_KERNEL", "TRITON_"))}
    return env | {"TRITON_CACHE_DIR": str(triton_cache)}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, dict]:
    """`glm53ctl build` of two keys in a process of its own: the build folder and its manifest."""
    out = tmp_path_factory.mktemp("build")
    args = ["build", "-m", "tiny", "--kind", "embed,tail", "--tp", "2", "--rows", "1", "-j", "2", "--out", str(out)]
    env = _env(tmp_path_factory.mktemp("triton"))
    p = subprocess.run(
        [sys.executable, "-m", "glm53ctl", *args, "--json"], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return out, json.loads(p.stdout)


def _probe(cache, keys, tmp_path) -> tuple[dict, str]:
    env = _env(tmp_path / "triton")
    p = subprocess.run(
        [sys.executable, str(PROBE), str(cache), *keys], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_the_build_writes_a_cache_of_every_kernel_it_built(built):
    out, manifest = built
    head = json.loads((out / "kernels" / "CACHE.json").read_text())
    assert head["target"] == "sm_90" and head["triton"] == manifest["triton"]
    assert head["env"] == {"TRITON_DISABLE_LINE_INFO": "true"}  # as every build compiles
    for e in manifest["keys"]:
        assert [k["role"] for k in e["kernels"]] == ["launch", "peer"]
        # beside the key's own launches, what check (its other grids and schedule) and bench (the separate
        # launches' baselines) launch of it
        variants = {"grid=1", "grid=3", "grid=64", "launch=stages", "separate", "separate-pdl"}
        assert {c["variant"] for c in e["carried"]} == variants
        for k in e["kernels"] + e["carried"]:
            assert "error" not in k, k
            entry = json.loads((out / "kernels" / k["entry"] / "entry.json").read_text())
            assert entry["kernel"] == k["symbol"] and any(f.endswith(".cubin") for f in entry["files"])
    assert manifest["totals"]["carried"] == len(list((out / "kernels").glob("*/entry.json")))


@pytest.mark.parametrize("order", [KEYS, KEYS[::-1]], ids=["embed-first", "tail-first"])
def test_a_fresh_process_derives_the_builds_keys_and_loads_them(built, tmp_path, order):
    """Triton's own JIT keys the real arguments; every kernel loads, none compiles, in either order (Triton 3.6's
    key of a kernel depends on the kernels keyed before it in the process unless settled: kernel_cache)."""
    counts, err = _probe(built[0] / "kernels", order, tmp_path)
    assert "Warning" not in err, err
    for name in NAMES:
        assert counts[name] | {"compile_s": 0} == {
            "loaded": KERNELS,
            "reused": 0,
            "compiled": 0,
            "compile_s": 0,
            "misses": [],
        }


def test_without_a_cache_the_same_launches_compile(tmp_path):
    counts, _ = _probe("-", KEYS[:1], tmp_path)
    assert counts[NAMES[0]]["compiled"] == KERNELS and counts[NAMES[0]]["loaded"] == 0
    assert counts[NAMES[0]]["compile_s"] > 0


def test_a_corrupt_entry_is_named_and_compiled(built, tmp_path):
    out, manifest = built
    cache = shutil.copytree(out / "kernels", tmp_path / "kernels")
    embed = next(e for e in manifest["keys"] if e["kind"] == "embed")
    entry = cache / next(k["entry"] for k in embed["kernels"] if k["role"] == "launch")
    cubin = next(entry.glob("*.cubin"))
    cubin.write_bytes(cubin.read_bytes()[:100])  # truncated
    counts, err = _probe(cache, KEYS[:1], tmp_path)
    assert f"kernel cache entry {entry} is corrupt" in err and "compiling it here" in err
    assert counts[NAMES[0]]["loaded"] == KERNELS - 1 and counts[NAMES[0]]["compiled"] == 1
    assert counts[NAMES[0]]["misses"] == ["embed_kernel: its entry " + entry.name[:12] + " is damaged"]


def test_a_cache_of_another_triton_warns_once_and_compiles_every_kernel(built, tmp_path):
    cache = shutil.copytree(built[0] / "kernels", tmp_path / "kernels")
    head = json.loads((cache / "CACHE.json").read_text())
    (cache / "CACHE.json").write_text(json.dumps(head | {"triton": "3.5.0"}))
    counts, err = _probe(cache, KEYS, tmp_path)
    warnings = [line for line in err.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == 1 and "built for Triton 3.5.0" in warnings[0], err
    assert "every kernel compiles here" in warnings[0]
    for name in NAMES:
        assert counts[name]["loaded"] == 0 and counts[name]["compiled"] == KERNELS


def test_a_cache_folder_that_is_none_is_a_usage_error(tmp_path):
    from glm53ctl.errors import UsageError
    from glm53ctl.kernels.kernel_cache import open_cache

    for path, says in ((tmp_path / "absent", "no such folder"), (tmp_path, "not a kernel cache (no CACHE.json)")):
        with pytest.raises(UsageError, match=r"--cache .*" + says.replace("(", r"\(").replace(")", r"\)")):
            open_cache(path)
    (tmp_path / "CACHE.json").write_text("{not json")
    with pytest.raises(UsageError, match="CACHE.json is not readable JSON"):
        open_cache(tmp_path)


def test_a_workers_counts_reach_its_parent():
    """A command's worker processes (check's per-key workers, bench's compile workers) count in a log the command
    reads: their compiles are in its report under the key each worked on."""
    from glm53ctl.kernels import kernel_cache

    worker = (
        "from glm53ctl.kernels import kernel_cache as k\n"
        "with k.counting('tiny/embed/tp2/r1'):\n"
        "    k._record(k.Counts(compiled=1, compile_s=2.5, misses=['embed_kernel: not built ahead']))\n"
    )
    with kernel_cache.tallied() as so_far:
        subprocess.run([sys.executable, "-c", worker], env=dict(os.environ), check=True, cwd=ROOT)
        with kernel_cache.counting("tiny/tail/tp2/r1"):
            kernel_cache._record(kernel_cache.Counts(loaded=2))
        counts = so_far()
    assert counts["tiny/embed/tp2/r1"].as_dict() == {
        "loaded": 0,
        "reused": 0,
        "compiled": 1,
        "compile_s": 2.5,
        "misses": ["embed_kernel: not built ahead"],
    }
    assert counts["tiny/tail/tp2/r1"].loaded == 2


def test_check_in_the_interpreter_says_a_cache_loads_nothing(capsys, built):
    from tests.helpers import invoke

    cache = built[0] / "kernels"
    code, _, err = invoke(capsys, "check", "--kind", "embed", "--tp", "1", "--rows", "1", "--cache", cache)
    assert code == 0, err
    assert f"--cache {cache}: the interpreter compiles nothing" in err


def test_prune_removes_the_kernel_cache_build_keeps(capsys, tmp_path):
    from tests.helpers import invoke_json

    (tmp_path / "kernels" / "ab12").mkdir(parents=True)
    (tmp_path / "kernels" / "CACHE.json").write_text("{}")
    (tmp_path / "mine").mkdir()  # not glm53ctl's: kept
    doc = invoke_json(capsys, "prune", "--cache", tmp_path)
    assert [r["path"] for r in doc["removed"]] == [str(tmp_path / "kernels")]
    assert not (tmp_path / "kernels").exists() and (tmp_path / "mine").is_dir()
