"""Issue 30: what a new user hit with paths. Unwritable places, a folder where a file is expected (or the other way
round), bad bounds: each an `Error:` with a hint and exit 2, never a traceback, and nothing lost."""

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import invoke, invoke_json
from tests.readonly import read_only_folder

EMBED = ["build", "--model", "tiny", "--kind", "embed", "--tp", "1", "--rows", "1", "-j", "1"]


def _usage(code: int, err: str, says: str) -> None:
    assert code == 2, err
    assert says in err and "Hint:" in err and "Traceback" not in err, err


def test_build_out_under_a_file(capsys, tmp_path):
    """Before: NotADirectoryError from a compile worker, after the compiling started. Fails for root too."""
    f = tmp_path / "file"
    f.write_text("mine")
    code, out, err = invoke(capsys, *EMBED, "--out", f / "sub")
    _usage(code, err, f"--out {f / 'sub'}: {f} is a file, not a folder")
    assert out == "" and f.read_text() == "mine"


def test_build_out_in_a_read_only_folder(capsys, tmp_path):
    """Before: OSError (read-only file system, or permission denied) from a compile worker."""
    with read_only_folder(tmp_path / "ro") as ro:
        code, _, err = invoke(capsys, *EMBED, "--out", ro / "b")
        _usage(code, err, f"--out {ro / 'b'}: folder {ro} is not writable")
        assert list(ro.iterdir()) == []


def test_build_from_a_read_only_working_folder(capsys, tmp_path, monkeypatch):
    """Before: `OSError: [Errno 30] Read-only file system: 'build'`: the default --out is build/ right here."""
    with read_only_folder(tmp_path / "ro") as ro:
        monkeypatch.chdir(ro)
        code, _, err = invoke(capsys, *EMBED)
        _usage(code, err, f"--out build: the working folder {ro} is not writable")


def test_build_cache_that_cannot_be_written_after_the_checks(capsys, tmp_path, monkeypatch):
    """A write that fails once compiling has started (a disk filled up, a folder made read-only since): the
    failing path named, exit 2."""

    def boom(keys, target, out, jobs, progress=None, variants=None):
        raise OSError(errno.EROFS, "Read-only file system", str(out / "cache" / "x.json"))

    monkeypatch.setattr("glm53ctl.commands.build.run_build", boom)
    code, _, err = invoke(capsys, *EMBED, "--out", tmp_path / "b")
    _usage(code, err, f"cannot write {tmp_path / 'b' / 'cache' / 'x.json'} (Read-only file system)")


def test_build_says_one_key_not_one_keys(capsys, tmp_path):
    code, out, err = invoke(capsys, *EMBED, "--out", tmp_path)
    assert code == 0, err
    assert "building 1 key for sm_90 with 1 process" in err
    assert "1 key, 1 kernel, 1 distinct code object;" in out


def test_compare_a_folder_is_not_a_saved_run(capsys, tmp_path):
    """Before: "no such file" for a folder that is there."""
    code, _, err = invoke(capsys, "compare", tmp_path, tmp_path / "b.safetensors")
    _usage(code, err, f"{tmp_path}: is a folder, not a saved run")


@pytest.mark.parametrize("bound", ["-1", "nan", "-0.5"])
def test_compare_bound_must_be_zero_or_more(capsys, tmp_path, bound):
    """Before: accepted; every tensor then 'over the bound' and exit 1 (a check failed, not a typo)."""
    code, _, err = invoke(capsys, "compare", tmp_path / "a", tmp_path / "b", "--bound", bound)
    _usage(code, err, f"--bound {float(bound):g}: expected a relative RMS error of 0 or more")


def test_compare_checks_its_paths_before_it_reads_a_file(tmp_path):
    """`compare nope x`: "no such file", exit 2, nothing read. (Until issue 46 it came before torch was imported;
    the command's module now imports torch at its top.)"""
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\nfrom glm53ctl.cli import run_cli\n"
            f"code = run_cli(['compare', {str(tmp_path / 'nope')!r}, 'x'])\nprint(code, 'safetensors' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.stdout.split() == ["2", "False"], (p.stdout, p.stderr)
    assert f"Error: {tmp_path / 'nope'}: no such file" in p.stderr and "Hint:" in p.stderr


def test_compare_says_one_tensor(capsys, tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"x": torch.ones(3)}, str(tmp_path / "a.safetensors"))
    save_file({"x": torch.tensor([1.0, float("nan"), 1.0])}, str(tmp_path / "b.safetensors"))
    doc = invoke_json(capsys, "compare", tmp_path / "a.safetensors", tmp_path / "a.safetensors")
    assert doc["summary"] == "1 of 1 tensor bitwise equal"
    code, out, _ = invoke(capsys, "compare", tmp_path / "a.safetensors", tmp_path / "b.safetensors", "--json")
    assert code == 1 and "NaN in one and not the other at 1 element" in out


def test_prune_a_cache_that_is_not_there(capsys, tmp_path):
    """Before: "nothing to prune in /nonexistent", exit 0: a typo passed for an empty cache."""
    code, out, err = invoke(capsys, "prune", "--cache", tmp_path / "absent")
    _usage(code, err, f"--cache {tmp_path / 'absent'}: no such folder")
    assert out == ""
    (tmp_path / "f").write_text("mine")
    code, _, err = invoke(capsys, "prune", "--cache", tmp_path / "f")
    _usage(code, err, f"--cache {tmp_path / 'f'}: is a file, not a folder")
    assert (tmp_path / "f").read_text() == "mine"


def test_prune_by_default_with_no_build_folder_is_nothing_to_do(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = invoke(capsys, "prune")
    assert code == 0 and "nothing to prune in build (no such folder here)" in out


def test_prune_says_one_item(capsys, tmp_path):
    cache = tmp_path / "c"
    (cache / "cache").mkdir(parents=True)
    (cache / "cache" / ("a" * 64 + ".json")).write_text("{}")
    code, out, _ = invoke(capsys, "prune", "--cache", cache, "--dry-run")
    assert code == 0 and "would remove 1 item," in out


def test_prune_a_read_only_cache(capsys, tmp_path):
    """Before: PermissionError (or EROFS) out of shutil.rmtree."""
    cache = tmp_path / "c"
    (cache / "cache").mkdir(parents=True)
    record = cache / "cache" / ("a" * 64 + ".json")
    record.write_text("{}")
    with read_only_folder(cache / "cache"):
        code, _, err = invoke(capsys, "prune", "--cache", cache)
        _usage(code, err, f"--cache {cache}: cannot remove")
    assert record.read_text() == "{}"


def test_path_helpers_name_a_file_in_the_way(tmp_path):
    """check_replaceable (run --out and the like): a parent that is a file said "does not exist"."""
    from glm53ctl.errors import UsageError
    from glm53ctl.files import check_replaceable

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_replaceable("--out", f / "sub" / "o.safetensors")
    with pytest.raises(UsageError, match="folder .* does not exist"):
        check_replaceable("--out", tmp_path / "absent" / "o.safetensors")


def test_read_only_helper_stops_root_too(tmp_path):
    with read_only_folder(tmp_path / "ro") as ro:
        with pytest.raises(OSError):
            (Path(ro) / "x").write_text("x")
