"""`glm53ctl tune` through the command on a CPU (issue 30, what a new user hit): every bad --storage and --plots is
an `Error:` + `Hint:` with exit 2 and no traceback, and leaves the folder as it found it (no empty database, no
journal, no plots folder); the table reads at 100 columns; bench's compile baseline holds torch.compile's
warnings back. The PostgreSQL cases against a real server are in test_tune_storage.py."""

from __future__ import annotations

import hashlib
import io
import math
import os
import socket
import sys
from pathlib import Path

import pytest

from glm53ctl.errors import UsageError
from glm53ctl.tuning.tune import search, storage_of
from tests.helpers import invoke
from tests.tuning.synthetic import SyntheticEvaluator

DEFAULT_STORAGE = "sqlite:///build/tune/studies.db"  # tune's default, as its help and docs/knobs.md say
TUNE = ["tune", "--tp", "4", "--rows", "2", "--kind", "dense"]
DEFAULT = {"a": 1, "b": 1, "c": 1}
SPACE = {"a": (0, 1, 2), "b": (0, 1, 2), "c": (0, 1, 2)}


def true_us(k: dict) -> float:
    return 50.0 + 3 * k["a"] + 2 * k["b"] - 4 * k["c"]


def _tree(root: Path) -> list:
    """Every path under root, with a digest of each file's bytes: what a failed command must leave as it was."""
    out = []
    for p in sorted(root.rglob("*")):
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        out.append((str(p.relative_to(root)), digest))
    return out


def _fails(capsys, *args, says: str) -> str:
    """The command's one error: exit 2, `Error:` first (saying `says`), a `Hint:`, no traceback, nothing on
    stdout. Its first line."""
    code, out, err = invoke(capsys, *args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (args, code, err)
    assert out == "" and "Traceback" not in err, err
    assert lines and lines[0].startswith("Error:") and says in lines[0], (args, err)
    assert any(ln.startswith("Hint:") for ln in lines[1:]), err
    return lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working folder holding what a user may point --storage at by mistake; no GPU (the --plots path)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "junk.db").write_text("not a database\n")
    (cwd / "junk.log").write_text("hello\n")
    (cwd / "afile").write_text("a file\n")
    (cwd / "d.log").mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr("glm53ctl.commands.tune.gpu_count", lambda: 0)
    return cwd


@pytest.fixture
def readonly(tmp_path):
    """A folder nobody here can write in: a chmod 555 one, or (as root, which chmod does not stop) /sys, where
    even root makes no folder."""
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    try:
        (Path("/sys") / "glm53ctl-probe").mkdir()
    except OSError:
        yield Path("/sys")
        return
    (Path("/sys") / "glm53ctl-probe").rmdir()
    pytest.skip("no read-only place here: root, and /sys takes folders")


BAD_STORAGE = [
    (["--storage", "notaurl"], "notaurl: not a database URL or a journal file"),
    (["--storage", "foo://bar"], "no database kind 'foo'"),
    (["--storage", "postgres://me@db.example/studies"], "no database kind 'postgres'"),
    (["--storage", "mysql://me@db.example/studies"], "the Python module 'MySQLdb', is not installed"),
    (["--storage", "sqlite://"], "an SQLite database in memory"),
    (["--storage", "sqlite:///d.log"], "d.log is a folder, not a file"),
    (["--storage", "sqlite:///junk.db"], "junk.db is not an SQLite database (left as it is)"),
    (["--storage", "sqlite:///nofolder/s.db"], "no folder nofolder"),
    (["--storage", "sqlite:///afile/s.db"], "afile is a file, not a folder"),
    (["--storage", "nofolder/study.log"], "no folder nofolder"),
    (["--storage", "afile/study.log"], "afile is a file, not a folder"),
    (["--storage", "d.log"], "d.log is a folder, not a file"),
    (["--storage", "junk.log"], "junk.log is not an Optuna journal file (left as it is)"),
    # --plots reads: what is not there is not made
    (["--plots", "p"], "no such file build/tune/studies.db, so no studies to read"),
    (["--storage", "sqlite:///new.db", "--plots", "p"], "no such file new.db"),
    (["--storage", "new.log", "--plots", "p"], "no such file new.log"),
    (["--storage", "junk.log", "--plots", "p"], "junk.log is not an Optuna journal file"),
    (["--plots", "afile"], "--plots afile: a file, not a folder"),
    (["--plots", "afile/plots"], "afile is a file, not a folder"),
]


@pytest.mark.parametrize("args, says", BAD_STORAGE, ids=[" ".join(a) for a, _ in BAD_STORAGE])
def test_a_bad_storage_or_plots_folder_is_an_error_that_changes_nothing(here, capsys, args, says):
    before = _tree(here)
    _fails(capsys, *TUNE, *args, says=says)
    assert _tree(here) == before


def test_nothing_listening_at_a_postgres_url(here, capsys):
    """The documented form, no server at it: the driver's words, where to look, the password not shown; in the
    command (--plots opens it on a CPU) and in storage_of, which a GPU's tune opens it with."""
    url = f"postgresql://me:secret@127.0.0.1:{_free_port()}/studies"
    before = _tree(here)
    first = _fails(capsys, *TUNE, "--storage", url, "--plots", "p", says="cannot open it: connection failed")
    assert "Connection refused" in first and "me:***@127.0.0.1" in first
    assert "secret" not in capsys.readouterr().err
    assert _tree(here) == before
    with pytest.raises(UsageError, match="Connection refused") as e:
        storage_of(url)
    assert "secret" not in e.value.message and "PostgreSQL server running at 127.0.0.1" in e.value.hint


def test_a_missing_postgres_driver_names_the_package(here, capsys, monkeypatch):
    """postgresql:// goes through psycopg 3 (what `glm53ctl[postgres]` installs), whatever SQLAlchemy's version;
    without it, the error says so."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as where it is not installed
    _fails(capsys, *TUNE, "--storage", "postgresql://me@db.example/studies", says="the Python module 'psycopg'")
    code, _, err = invoke(capsys, *TUNE, "--storage", "postgresql://me@db.example/studies")
    assert code == 2 and "pip install 'glm53ctl[postgres]'" in err


def test_the_documented_postgres_url_is_psycopg_3():
    from glm53ctl.tuning.storage import check_storage

    assert check_storage("postgresql://me@db.example/studies").drivername == "postgresql+psycopg"


def test_tune_without_a_gpu_makes_no_storage(here, capsys, monkeypatch):
    """The GPU check comes before the storage is opened: `tune` on a CPU (the tests' own runs of it too) leaves no
    build/tune/studies.db behind."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    before = _tree(here)
    _fails(capsys, *TUNE, says="needs a CUDA GPU")
    _fails(capsys, *TUNE, "--storage", "sqlite:///s.db", says="needs a CUDA GPU")
    _fails(capsys, *TUNE, "--storage", "s.log", says="needs a CUDA GPU")
    assert _tree(here) == before and not (here / "build").exists()


@pytest.fixture
def stored(here):
    """A study `s` in sqlite:///studies.db (the folder's), as a GPU's tune leaves it."""
    url = "sqlite:///studies.db"
    search(SyntheticEvaluator(true_us, seed=1), DEFAULT, SPACE, storage_of(url), "s", trials=6)
    return url


def test_a_failed_plots_makes_nothing(stored, here, capsys):
    args = [*TUNE, "--storage", stored, "--plots", "plots"]
    before = _tree(here)
    _fails(capsys, *args[:-2], "--study", "nope", "--plots", "plots", says="no study 'nope'")
    _fails(capsys, *TUNE, "--storage", "sqlite:///other.db", "--study", "s", "--plots", "plots", says="no such file")
    assert _tree(here) == before  # the database not written either (opened read-only)
    code, _, err = invoke(capsys, *args[:-2], "--study", "s", "--plots", "plots")
    assert code == 0, err
    assert sorted(p.name for p in (here / "plots").iterdir()) == ["s-history.png", "s-importances.png"]


def test_plots_into_a_read_only_place(stored, here, readonly, capsys):
    before = _tree(here)
    target = readonly / "plots"
    first = _fails(capsys, *TUNE, "--storage", stored, "--study", "s", "--plots", target, says=f"--plots {target}")
    assert "read-only" in first or "cannot make the folder" in first
    assert _tree(here) == before and not target.exists()


def test_the_default_storage_from_a_read_only_folder(here, readonly, capsys, monkeypatch, tmp_path):
    """Run from a folder where build/tune cannot be made: --plots says there are no studies; opening the default
    storage for a search (storage_of, what a GPU's tune does) names the folder it cannot make; nothing is made."""
    monkeypatch.chdir(readonly)
    _fails(capsys, *TUNE, "--plots", tmp_path / "p", says="no such file build/tune/studies.db")
    with pytest.raises(UsageError, match="build/tune") as e:
        storage_of(DEFAULT_STORAGE)
    assert e.value.hint and not (readonly / "build").exists() and not (tmp_path / "p").exists()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code, _, err = invoke(capsys, *TUNE)  # the default's folder not makeable, or no GPU: either way exit 2
    assert code == 2 and "Traceback" not in err and not (readonly / "build").exists()


# --- the table at 100 columns --------------------------------------------------------------------------------


def _results() -> list[dict]:
    """What tune's decide gives for two keys where many knobs are dropped, each with its long reason."""
    from glm53ctl.tuning.tune import decide

    space = {f"knob_{i}": (0, 1) for i in range(6)}
    default = dict.fromkeys(space, 0)
    gains = [0.97, 1.03, 0.999, 1.02, 1.01, 0.998]
    us = lambda k: 100.0 * math.prod(g if k[n] else 1.0 for n, g in zip(space, gains, strict=True))  # noqa: E731
    out = []
    for rows in (1, 2):
        import optuna

        ev = SyntheticEvaluator(us, noise=0.002, seed=rows)
        study = search(ev, default, space, optuna.storages.InMemoryStorage(), f"s{rows}", trials=64, seed=rows)
        res = decide(ev, study, default, space, rounds=9, where=f"at TP4 rows {rows}")
        out.append({"kind": "dense", "tp": 4, "rows": rows, "storage": "sqlite:///s.db"} | res.to_json())
    return out


def test_the_table_reads_at_100_columns():
    from rich.console import Console

    from glm53ctl.commands.tune import print_table
    from glm53ctl.output import Output

    results = _results()
    dropped = [d for r in results for d in r["decisions"] if not d["kept"]]
    assert len(dropped) >= 6 and max(len(d["reason"]) for d in dropped) > 80  # the long reasons are there
    o = Output(False)
    buf = io.StringIO()
    o.out = Console(file=buf, width=100, highlight=False, soft_wrap=True)
    print_table(o, "glm53_flash", results)
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 100, "\n".join(lines)
    text = "\n".join(lines)
    for d in dropped:  # each dropped knob on a line of its own, unbroken, its number beside it
        assert any(f"{d['knob']}={d['value']} " in ln for ln in lines), (d, text)
    assert "in the search (" not in text and "against the default's" not in text  # the reasons: --json's
    body = [ln for ln in lines if ln.startswith("│")]
    # a line per knob kept or dropped (at least the three of the trials' counts), not a paragraph per reason
    tall = [max(3, len(r["kept"]), sum(1 for d in r["decisions"] if not d["kept"])) for r in results]
    assert len(body) == sum(tall), text


# --- bench's compile baseline: torch.compile's warnings held back --------------------------------------------------


def _recompiling(fn):
    """fn through torch.compile (the eager backend: Dynamo alone, cheap on a CPU); with the recompile limit at 1,
    a third shape makes Dynamo log its `hit config.recompile_limit` warning."""
    import torch

    return torch.compile(fn, backend="eager", dynamic=False)


def test_the_compile_baseline_holds_back_torch_compiles_warnings(caplog, monkeypatch):
    import logging
    import warnings

    import torch
    import torch._dynamo

    from glm53ctl.kernels.kinds.harness import Timed
    from glm53ctl.tuning.bench import variant

    monkeypatch.delenv("TORCH_LOGS", raising=False)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)

    def notes(x):
        """What Inductor says on a GPU, said here: a note (WARNING), an error, a Python warning from its module."""
        logging.getLogger("torch._inductor.utils").warning("an Inductor note nobody asked for")
        logging.getLogger("torch._inductor.utils").error("a real Inductor error")
        warnings.warn_explicit("an Inductor UserWarning", UserWarning, "compile_fx.py", 1, module="torch._inductor.x")
        return x * 2 + 1

    class Harness:  # what variant asks of a kind's harness for `compile`: its stock call through torch.compile
        def compiled(self, x, peers):
            call = _recompiling(lambda c: notes(c["w"]))
            return Timed(call=call, copies=None, stream_bytes=1, nbytes=1, what="w")

    def said(run) -> tuple[str, list[str]]:
        """What run() logged at WARNING and above (torch's loggers) and the Python warnings it issued."""
        caplog.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
        return logged, [str(w.message) for w in caught]

    def three_shapes(call):
        for n in (2, 3, 4):
            assert torch.equal(call({"w": torch.ones(n)}), torch.full((n,), 3.0))

    # the control: the same compiled call, outside the baseline, says it all
    torch._dynamo.reset()
    logged, warned = said(lambda: three_shapes(Harness().compiled(None, None).call))
    assert "recompile_limit" in logged and "an Inductor note" in logged and "a real Inductor error" in logged
    assert "an Inductor UserWarning" in warned
    # bench's compile baseline: the notes held back, the error still shown
    t = variant(Harness(), None, None, "compile")
    logged, warned = said(lambda: three_shapes(t.call))
    assert "recompile_limit" not in logged and "an Inductor note" not in logged, logged
    assert "a real Inductor error" in logged and "an Inductor UserWarning" not in warned
    # an exception inside still raises; the loggers' levels are as they were after
    from glm53ctl.tuning.bench import compile_quiet

    levels = {n: logging.getLogger(n).level for n in ("torch._inductor", "torch._dynamo")}
    with pytest.raises(RuntimeError, match="a failed compile"), compile_quiet():
        raise RuntimeError("a failed compile")
    assert {n: logging.getLogger(n).level for n in levels} == levels
    torch._dynamo.reset()
