"""Issue 30: what a new user hit with the config files: migrate over read-only files, a diff unreadable at 100
columns, the newer-file hint lost, an older file called plainly "ok"."""

import json
import re

import pytest

from glm53ctl import tuned
from tests.configs.test_tuned import doc
from tests.helpers import invoke, invoke_json, write
from tests.readonly import read_only_folder


def _v1(path):
    """A schema v1 tuned file (v2 added `Entry.context`; a v1 file has none)."""
    return write(path, json.dumps(doc(schema_version=1)))


def test_migrate_refuses_a_read_only_file(capsys, tmp_path):
    """Before: the code said it never replaced a read-only file, and migrate replaced a 0444 one (as any user:
    the rename needs only the folder)."""
    path = _v1(tmp_path / "t.json")
    before = path.read_bytes()
    path.chmod(0o444)
    for args in ([], ["--dry-run"]):
        code, out, err = invoke(capsys, "configs", "migrate", *args, path)
        assert code == 2 and f"Error: {path}: the file is read-only; glm53ctl does not replace it" in err, err
        assert "Hint:" in err and "Traceback" not in err and f"{path}: error" in out
    assert path.read_bytes() == before and path.stat().st_mode & 0o777 == 0o444


def test_migrate_in_a_read_only_folder(capsys, tmp_path):
    """Before: an OSError traceback from the temp file's creation."""
    path = _v1(tmp_path / "ro" / "t.json")
    before = path.read_bytes()
    with read_only_folder(tmp_path / "ro"):
        code, _, err = invoke(capsys, "configs", "migrate", path)
        assert code == 2 and f"Error: {path}: folder {path.parent} is not writable" in err, err
        assert "Hint:" in err and "Traceback" not in err
        assert sorted(p.name for p in path.parent.iterdir()) == ["t.json"]
    assert path.read_bytes() == before


def test_migrate_goes_on_past_a_file_it_cannot_write(capsys, tmp_path):
    ro, ok = _v1(tmp_path / "a.json"), _v1(tmp_path / "b.json")
    ro.chmod(0o444)
    code, out, _ = invoke(capsys, "configs", "migrate", ro, ok)
    assert code == 2 and f"{ok}: migrated schema_version 1 → 2" in out
    assert json.loads(ok.read_text())["schema_version"] == 2 and json.loads(ro.read_text())["schema_version"] == 1


def test_migrate_a_file_the_write_fails_on(capsys, tmp_path, monkeypatch):
    """A write failing past the checks (a full disk): named, exit 2, the old file whole."""
    path = _v1(tmp_path / "t.json")
    before = path.read_bytes()

    def full(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", full)
    code, _, err = invoke(capsys, "configs", "migrate", path)
    assert code == 2 and f"{path}: cannot write the migrated file (No space left on device)" in err, err
    assert path.read_bytes() == before


def _newer(path):
    return write(path, json.dumps(doc(schema_version=tuned.SCHEMA_VERSION + 1)))


@pytest.mark.parametrize("command", ["validate", "migrate"])
def test_a_newer_file_says_to_upgrade(capsys, tmp_path, command):
    """Before: validate and migrate printed the error without its hint (only a load through the error boundary
    kept it)."""
    path = _newer(tmp_path / "t.json")
    code, _, err = invoke(capsys, "configs", command, path)
    assert code == 2 and "is newer than this glm53ctl reads" in err
    assert "Hint: a newer glm53ctl wrote it: upgrade glm53ctl" in err


def test_show_says_a_newer_file_needs_an_upgrade(capsys, tmp_path, monkeypatch):
    _newer(tmp_path / "tuned" / "tiny" / "tp4.json")
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path))
    code, _, err = invoke(capsys, "configs", "show")
    assert code == 2 and "is newer than this glm53ctl reads" in err and "Hint: a newer glm53ctl wrote it" in err
    code, _, err = invoke(capsys, "configs", "show", "--model", "tiny", "--tp", "4")
    assert code == 2 and "Hint: a newer glm53ctl wrote it" in err


@pytest.mark.parametrize("command", ["validate", "migrate"])
def test_a_missing_schema_version_is_called_missing(capsys, tmp_path, command):
    """Before: "schema_version: expected a positive integer, found None"."""
    d = doc()
    del d["schema_version"]
    path = write(tmp_path / "t.json", json.dumps(d))
    code, _, err = invoke(capsys, "configs", command, path)
    assert code == 2 and f"{path}: schema_version: missing" in err and "found None" not in err
    assert f'Hint: add "schema_version": {tuned.SCHEMA_VERSION}' in err


def test_validate_says_an_older_file_wants_migrating(capsys, tmp_path):
    """Before: a v1 file was "ok", nothing said it reads migrated and `configs migrate` brings it up."""
    old, new = _v1(tmp_path / "old.json"), write(tmp_path / "new.json", json.dumps(doc()))
    code, out, err = invoke(capsys, "configs", "validate", old, new)
    assert code == 0, err
    assert re.search(r"│ ok, schema v1: wants migrating +│", out) and re.search(r"│ ok +│", out)
    assert f"{old}: schema v1: `glm53ctl configs migrate {old}` brings it to v{tuned.SCHEMA_VERSION}\n" in out
    assert "2 of 2 files valid; 1 at an older schema" in out
    res = invoke_json(capsys, "configs", "validate", old, new)
    assert [f["schema_version"] for f in res["files"]] == [1, tuned.SCHEMA_VERSION] and res["ok"]


def test_show_gives_a_files_own_schema_version(capsys, tmp_path, monkeypatch):
    """Before: a v1 file showed as schema 2 (the version it reads as)."""
    _v1(tmp_path / "tuned" / "tiny" / "tp4.json")
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(tmp_path))
    (row,) = invoke_json(capsys, "configs", "show")["tuned"]
    assert row["schema_version"] == 1


def test_validate_says_one_file(capsys, tmp_path):
    path = write(tmp_path / "t.json", json.dumps(doc()))
    code, out, _ = invoke(capsys, "configs", "validate", path)
    assert code == 0 and "1 of 1 file valid" in out


def _diff_pair(tmp_path):
    d = doc()
    d["entries"]["dense"]["2"]["dropped"] = [
        {"knob": "box_words", "value": 16, "reason": "box_words=16: 4.6% slower at TP4 rows 2 in the search (trial 1)"},
        {"knob": "box_words", "value": 8, "reason": "box_words=8: 18.4% slower at TP4 rows 2 in the search (trial 4)"},
    ]
    a = write(tmp_path / "a.json", json.dumps(d))
    e = d["entries"]["dense"]["2"]
    e["evidence"]["ratio"] = 1.0300000000000002
    e["evidence"]["ratio_ci"] = [0.97, 0.99]
    e["dropped"] = e["dropped"][:1]
    d["provenance"]["command"] = "glm53ctl tune --tp 4 --rows 1,2,8 --kind dense,tail --space oproj_first,box_words "
    d["provenance"]["command"] += "--trials 40 --storage sqlite:////home/someone/studies/glm53.db --write --json"
    return a, write(tmp_path / "b.json", json.dumps(d))


def test_diff_reads_at_100_columns(capsys, tmp_path, monkeypatch):
    """Before (stdout a file): the knob named twice in every dropped cell (`box_words=16: box_words=16: ...`),
    every drop on one line, 1.0300000000000002 and (0.97, 0.99): a table 400 columns wide."""
    monkeypatch.chdir(tmp_path)  # a title of two short paths: the cells are the test
    _diff_pair(tmp_path)
    code, out, err = invoke(capsys, "configs", "diff", "a.json", "b.json")
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 100, max(lines, key=len)
    assert "box_words=16: box_words=16" not in out and "box_words=8: box_words=8" not in out
    assert "1.0300000000000002" not in out and re.search(r"│ 0\.95 +│ 1\.03 +│", out)
    assert re.search(r"│ 0\.94, 0\.96 +│ 0\.97, 0\.99 +│", out) and "(0.97" not in out
    # only the drop that differs: B keeps box_words=16's, so that one is in neither cell
    assert "- box_words=8: 18.4% slower" in out and "box_words=16" not in out


def test_diff_json_keeps_the_values(capsys, tmp_path):
    a, b = _diff_pair(tmp_path)
    changes = {c["knob"]: c for c in invoke_json(capsys, "configs", "diff", a, b)["changes"]}
    assert changes["evidence.ratio"]["b"] == 1.0300000000000002 and changes["evidence.ratio_ci"]["b"] == [0.97, 0.99]
    assert changes["dropped"]["a"] == ["box_words=8: 18.4% slower at TP4 rows 2 in the search (trial 4)"]
    assert changes["dropped"]["b"] == []


def test_config_dir_that_is_a_file(capsys, tmp_path, monkeypatch):
    """Before: "GLM53CTL_CONFIG_DIR=...: no such folder" for a file that is there."""
    f = write(tmp_path / "tp4.json", json.dumps(doc()))
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(f))
    code, _, err = invoke(capsys, "configs", "show")
    assert code == 2 and f"GLM53CTL_CONFIG_DIR={f}: is a file, not a folder" in err and "Hint:" in err
