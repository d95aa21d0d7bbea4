"""tune.search on real storage with real processes: a study killed mid-way (SIGKILL) resumes without losing a
finished trial; two worker processes share one study through a journal file and through a PostgreSQL server
this module starts; workers that start together enqueue the default once. The evaluator is the synthetic one
(tests/tuning/synthetic.py); the workers are tests/tuning/tune_storage_worker.py in child Pythons.

The server is a real PostgreSQL, started here from the `pgserver` wheel's binaries (a test dependency) or a
system install's; where neither is there the PostgreSQL tests fail, never skip: CI (.ci/run) runs them."""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from glm53ctl.tuning.tune import search, storage_of
from tests.tuning.synthetic import SyntheticEvaluator
from tests.tuning.tune_storage_worker import DEFAULT, SPACE, true_us

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().with_name("tune_storage_worker.py")

pytestmark = pytest.mark.slow


# --- helpers -------------------------------------------------------------------------------------------------


def _states():
    from optuna.trial import TrialState

    return TrialState


def _finished(study) -> list:
    ts = _states()
    return [t for t in study.get_trials(deepcopy=False) if t.state in (ts.COMPLETE, ts.PRUNED)]


def _load(storage, name):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def _spawn(
    storage: str,
    name: str,
    trials: int,
    *,
    sleep: float,
    seed: int,
    go: Path | None = None,
    holds: dict[str, Path] | None = None,
    samples: int = 3,
) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(WORKER),
        storage,
        name,
        str(trials),
        "--sleep",
        str(sleep),
        "--seed",
        str(seed),
        "--samples",
        str(samples),
    ]
    if go is not None:
        cmd += ["--go", str(go)]
    for what, folder in (holds or {}).items():
        cmd += [f"--hold-{what}", str(folder)]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_two(
    tmp_path: Path,
    storage: str,
    name: str,
    trials: int,
    *,
    sleep: float,
    staggered: bool = False,
    holds: tuple[str, ...] = (),
):
    """Two workers on one study, each released once it has imported everything: together, or (`staggered`) the
    second once the first has finished its first trial (the default), so that it joins a study under way.
    `holds`: the worker's --hold-* races to make certain. (returncode, trial numbers it finished, stderr) per
    worker."""
    tag = uuid.uuid4().hex[:6]
    go = [tmp_path / f"go-{tag}-{i}" for i in range(2)]
    folders = {}
    for what in holds:
        folders[what] = tmp_path / f"hold-{what}-{tag}"
        folders[what].mkdir()
    procs = [
        _spawn(storage, name, trials, sleep=sleep, seed=seed, go=g, holds=folders)
        for seed, g in zip((1, 2), go, strict=True)
    ]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("READY"), f"worker did not start: {line!r}\n{p.stderr.read()}"
        early = ""
        go[0].touch()
        if staggered:
            early = procs[0].stdout.readline()
            assert early.startswith("TRIAL "), f"the first worker finished no trial: {early!r}"
        go[1].touch()
        out = []
        for p, head in zip(procs, (early, ""), strict=True):
            stdout, stderr = p.communicate(timeout=90)
            numbers = [int(ln.split()[1]) for ln in (head + stdout).splitlines() if ln.startswith("TRIAL ")]
            out.append((p.returncode, numbers, stderr))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _check_shared_study(study, workers, trials: int, raced: bool = False) -> None:
    """What two workers sharing one study of `trials` must leave. `raced`: the workers were held so that both
    found the study empty; then one of them may have waited out the other's whole run, and the default need
    not be trial 0, but it is still there once, finished."""
    ts = _states()
    for rc, _, err in workers:
        assert rc == 0, f"a worker failed (rc {rc}):\n{err[-3000:]}"
    finished = _finished(study)
    numbers = sorted(t.number for t in finished)
    # every trial finished, none left running or waiting
    assert [(t.number, t.state.name) for t in study.trials if t.state not in (ts.COMPLETE, ts.PRUNED)] == []
    # MaxTrialsCallback is checked by each worker after its own trial: the worker that did not finish the
    # `trials`-th trial was mid-trial then and finishes that one too, so two workers may end one over
    assert trials <= len(finished) <= trials + 1, numbers
    # no two workers ran the same trial, and together they ran them all; both ran some
    (_, a, _), (_, b, _) = workers
    assert not set(a) & set(b), (a, b)
    assert sorted(a + b) == numbers
    if not raced:
        assert a and b, f"one worker ran no trial: {a} {b}"
    # the default: enqueued (flagged) once, finished; trial 0
    defaults = [t for t in study.trials if t.user_attrs.get("default")]
    assert defaults, "no trial is the default's"
    assert len(defaults) == 1, f"the default was enqueued {len(defaults)} times: trials {[t.number for t in defaults]}"
    assert defaults[0].params == DEFAULT and defaults[0].state == ts.COMPLETE
    if not raced:
        assert defaults[0].number == 0


# --- 1. a killed study resumes ---------------------------------------------------------------------------------


def test_killed_study_resumes_without_losing_finished_trials(tmp_path):
    ts = _states()
    url = f"sqlite:///{tmp_path / 'study.db'}"
    name, trials = "resume", 12
    storage = storage_of(url)  # the schema, before the child opens the file
    # each trial 3 samples of ~0.07 s: ~0.2 s
    child = _spawn(url, name, trials, sleep=0.07, seed=1)
    try:
        deadline = time.monotonic() + 60
        complete = []
        while time.monotonic() < deadline:
            assert child.poll() is None, f"the worker ended before it was killed:\n{child.stderr.read()}"
            try:
                sid = storage.get_study_id_from_name(name)
            except KeyError:
                sid = None
            if sid is not None:
                complete = storage.get_all_trials(sid, deepcopy=False, states=(ts.COMPLETE,))
                if len(complete) >= 3:
                    break
            time.sleep(0.02)
        assert len(complete) >= 3, "the worker finished no 3 trials in 60 s"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL

    before = {t.number: (t.state, t.params, t.value) for t in _finished(_load(storage_of(url), name))}
    assert 3 <= len(before) < trials, f"killed too late to prove a resume: {sorted(before)}"
    assert before[0][1] == DEFAULT

    ev = SyntheticEvaluator(true_us, seed=7)
    seen = []
    study = search(
        ev,
        DEFAULT,
        SPACE,
        storage_of(url),
        name,
        trials,
        seed=1,
        samples=3,
        on_trial=lambda s, t: seen.append(t.number),
    )

    after = {t.number: (t.state, t.params, t.value) for t in _finished(study)}
    # every trial finished before the kill is there, unchanged
    for n, rec in before.items():
        assert after.get(n) == rec, f"trial {n}: {rec} before the kill, {after.get(n)} after the resume"
    # exactly `trials` finished in all; the resumed run added the rest, after the killed run's trials
    assert len(after) == trials, sorted(after)
    assert len(seen) == trials - len(before)
    assert sorted(seen) == sorted(set(after) - set(before))
    assert min(seen) > max(before)
    # the default: trial 0, enqueued once, not timed again by the resumed run
    defaults = [t.number for t in study.trials if t.user_attrs.get("default")]
    assert defaults == [0]
    assert study.trials[0].params == DEFAULT and study.trials[0].state == ts.COMPLETE
    assert DEFAULT not in ev.timed
    # a trial the kill cut short is left RUNNING (its heartbeat grace is 120 s), never counted
    cut = [t for t in study.trials if t.state not in (ts.COMPLETE, ts.PRUNED)]
    assert all(t.state == ts.RUNNING and t.number not in after for t in cut), cut
    assert len(cut) <= 1


# --- 2. two workers, one journal file --------------------------------------------------------------------------


def test_two_workers_share_a_journal_study(tmp_path):
    path = str(tmp_path / "study.log")
    workers = _run_two(tmp_path, path, "shared", 10, sleep=0.03, staggered=True)
    _check_shared_study(_load(storage_of(path), "shared"), workers, 10)


# --- 3. two workers, one PostgreSQL database ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# the form docs/knobs.md, README.md and `tune -h` give: postgresql://user@host/db (here with the port)
DOCUMENTED_URL = re.compile(r"postgresql://\w+@[\w.]+(:\d+)?/\w+")


def _pg_bin() -> tuple[Path | None, list[str]]:
    """The PostgreSQL server's binaries: GLM53CTL_PG_BIN, else the `pgserver` wheel's (a test dependency, so that
    a clean clone's CI has a server), else a system install's. (folder or None, where it looked)."""
    looked = []
    candidates = []
    if os.environ.get("GLM53CTL_PG_BIN"):
        candidates.append(Path(os.environ["GLM53CTL_PG_BIN"]))
    spec = importlib.util.find_spec("pgserver")
    if spec is not None and spec.submodule_search_locations:
        candidates.append(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin")
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip()
        candidates.append(Path(out))
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name, reverse=True)
    for c in candidates:
        looked.append(str(c))
        if all((c / t).is_file() for t in ("initdb", "pg_ctl", "postgres")):
            return c, looked
    return None, looked


def _others_can_run(folder: Path) -> bool:
    """Whether a user other than the owner reaches and runs what is in `folder` (every folder above it o+x)."""
    return all(p.stat().st_mode & 0o001 for p in (folder, *folder.parents)) and bool(
        (folder / "postgres").stat().st_mode & 0o001
    )


def _copy_install(bin_dir: Path, to: Path) -> Path:
    """A copy of the install that `bin_dir` is in (its bin, lib and share: the binaries find those relative to
    themselves), where another user reaches it; a wheel's bundled libraries beside it as the wheel has them
    (pgserver/pginstall/bin finds ../../../pgserver.libs). The copy's bin folder."""
    install, package = bin_dir.parent, bin_dir.parent.parent
    shutil.copytree(install, to / package.name / install.name, symlinks=True)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, to / libs.name, symlinks=True)
    return to / package.name / install.name / bin_dir.name


def _server_user():
    """The user the server runs as where the tests run as root (it refuses root): `postgres`, else `nobody`."""
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


@pytest.fixture(scope="module")
def postgres():
    """A real PostgreSQL server on 127.0.0.1 at a free port, trust auth, its binaries from _pg_bin (run as
    another user when the tests run as root; copied where that user could not reach them, as in a virtual
    environment under a private temporary folder); a function that makes a fresh database and returns its URL,
    in the documented form. No server: the test fails (a skip would pass with nothing proven)."""
    import psycopg

    bin_dir, looked = _pg_bin()
    if bin_dir is None:
        pytest.fail(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in any of: "
            + (", ".join(looked) or "nothing found")
            + "; pip install -e '.[test]' brings pgserver's (Python 3.11, 3.12), or set GLM53CTL_PG_BIN"
        )
    base = Path(tempfile.mkdtemp(prefix="tune-pg-", dir="/tmp"))
    as_user: dict = {}
    if os.geteuid() == 0:
        owner = _server_user()
        if owner is None:
            pytest.fail("the tests run as root and there is no `postgres` or `nobody` user to run the server as")
        as_user = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        os.chmod(base, 0o755)
        if not _others_can_run(bin_dir):
            bin_dir = _copy_install(bin_dir, base / "pg")
    data, sock, log = base / "data", base / "s", base / "server.log"
    sock.mkdir()
    if as_user:
        for p in (base, sock):
            os.chown(p, as_user["user"], as_user["group"])
    port = _free_port()
    env = os.environ | {"LC_ALL": "C", "HOME": str(base)}

    def pg(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [str(bin_dir / args[0]), *args[1:]],
            cwd=base,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            **as_user,
        )
        if check and r.returncode != 0:
            server_log = log.read_text() if log.exists() else ""
            raise RuntimeError(f"{' '.join(args)}: rc {r.returncode}\n{r.stdout}\n{r.stderr}\n{server_log}")
        return r

    started = False
    try:
        pg("initdb", "-D", str(data), "--auth=trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C")
        opts = f"-k {sock} -c listen_addresses=127.0.0.1 -p {port} -c fsync=off -c max_connections=100"
        started = True
        pg("pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", opts, "start")
        made = []

        def database(unix_socket: bool = False) -> str:
            """A fresh database's URL: postgresql://postgres@127.0.0.1:PORT/DB, or (`unix_socket`) the form
            tuning/storage.py gives for a socket, postgresql://postgres@/DB?host=FOLDER&port=PORT."""
            db = f"tune_{len(made)}_{uuid.uuid4().hex[:6]}"
            with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as c:
                c.execute(f"CREATE DATABASE {db}")
            made.append(db)
            if unix_socket:
                return f"postgresql://postgres@/{db}?host={sock}&port={port}"
            url = f"postgresql://postgres@127.0.0.1:{port}/{db}"
            assert DOCUMENTED_URL.fullmatch(url), url
            return url

        database.port = port

        yield database
    finally:
        if started:
            pg("pg_ctl", "-D", str(data), "stop", "-m", "immediate", "-w", check=False)
        shutil.rmtree(base, ignore_errors=True)


def test_two_workers_share_a_postgres_study(tmp_path, postgres, capsys):
    """A fresh database at the documented URL (postgresql://user@host/db): the first worker makes the tables and
    the study, the second joins it; then `glm53ctl tune --storage URL --study NAME --plots DIR`, the command
    itself, reads the study from the server and draws it."""
    from tests.helpers import invoke

    url = postgres()
    assert DOCUMENTED_URL.fullmatch(url)
    workers = _run_two(tmp_path, url, "shared", 10, sleep=0.03, staggered=True)
    _check_shared_study(_load(storage_of(url), "shared"), workers, 10)
    args = ["tune", "--tp", "4", "--rows", "2", "--kind", "dense", "--storage", url, "--study", "shared"]
    code, out, err = invoke(capsys, *args, "--plots", tmp_path / "plots")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["shared-history.png", "shared-importances.png"]
    code, out, err = invoke(capsys, *args[:-1], "nope", "--plots", tmp_path / "plots2")
    assert code == 2 and "no study 'nope'" in err and "its studies: shared" in err and "Traceback" not in err
    assert not (tmp_path / "plots2").exists()


def test_a_postgres_study_through_a_unix_socket(tmp_path, postgres):
    """The socket form of the URL (postgresql://user@/db?host=FOLDER&port=PORT) opens the same way."""
    url = postgres(unix_socket=True)
    study = search(SyntheticEvaluator(true_us, seed=3), DEFAULT, SPACE, storage_of(url), "sock", 3, samples=1)
    assert len(_finished(study)) == 3 and _load(storage_of(url, create=False), "sock").trials[0].params == DEFAULT


def _tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url) as c:  # libpq takes the same URL
        return [r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]


def test_postgres_storage_problems_are_errors_that_create_nothing(tmp_path, postgres, capsys):
    """On a running server: a database that does not exist, a user that does not exist, a database without
    Optuna's tables to plot from: each `Error:` + `Hint:`, exit 2, no traceback; the empty database is left
    without tables (a failed --plots creates nothing), and no plots folder is made."""
    from glm53ctl.errors import UsageError
    from tests.helpers import invoke

    port = postgres.port
    empty = postgres()
    args = ["tune", "--tp", "4", "--rows", "2", "--kind", "dense", "--study", "s", "--plots", tmp_path / "plots"]
    cases = [
        (f"postgresql://postgres@127.0.0.1:{port}/no_such_db", 'database "no_such_db" does not exist'),
        (f"postgresql://nobody_here@127.0.0.1:{port}/postgres", 'role "nobody_here" does not exist'),
        (empty, "no studies in it (no Optuna tables)"),
    ]
    for url, says in cases:
        code, out, err = invoke(capsys, *args, "--storage", url)
        lines = err.splitlines()
        assert code == 2 and out == "", (url, err)
        assert lines[0].startswith("Error: --storage postgresql://") and says in lines[0], (url, err)
        assert any(ln.startswith("Hint:") for ln in lines) and "Traceback" not in err, err
    assert _tables(empty) == [] and not (tmp_path / "plots").exists()
    # what a GPU's `tune` opens (storage_of, the same function): the same error
    with pytest.raises(UsageError, match='database "no_such_db" does not exist'):
        storage_of(f"postgresql://postgres@127.0.0.1:{port}/no_such_db")


# --- 4. workers that start together ------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["journal", "postgres"])
def test_workers_starting_together_enqueue_the_default_once(tmp_path, request, backend):
    """Each worker, once it goes to enqueue the default, waits (up to 3 s) for the other to get there too: the
    interleaving where both found the study empty, made certain rather than left to chance. A search that
    enqueues the default once must leave one default trial however the workers interleave."""
    if backend == "journal":
        storage = str(tmp_path / "study.log")
    else:
        storage = request.getfixturevalue("postgres")()
        storage_of(storage)  # the tables first: this test is about the study, not the schema
    workers = _run_two(tmp_path, storage, "race", 4, sleep=0.01, holds=("enqueue",))
    _check_shared_study(_load(storage_of(storage), "race"), workers, 4, raced=True)


def test_workers_starting_together_on_a_fresh_postgres_database(tmp_path, postgres):
    """Both workers reach the making of the tables together (each waits, up to 3 s, for the other before
    SQLAlchemy's create_all): both must open the storage and finish the study (the default's enqueueing is
    the test above's)."""
    url = postgres()
    workers = _run_two(tmp_path, url, "fresh", 4, sleep=0.01, holds=("schema",))
    for rc, _, err in workers:
        assert rc == 0, f"a worker failed on a fresh database (rc {rc}):\n{err[-3000:]}"
    finished = _finished(_load(storage_of(url), "fresh"))
    assert 4 <= len(finished) <= 5
