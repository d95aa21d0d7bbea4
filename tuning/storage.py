"""Where `tune`'s studies live (--storage): an SQLite file, a PostgreSQL (or other SQLAlchemy) database, or an
Optuna journal file, opened so that every problem with it is a UsageError that names it and says what to do
(exit 2, no traceback), and so that a failed open leaves nothing behind (no empty database file, no folder).

The forms (docs/knobs.md, `tune -h`):

- `sqlite:///path.db` (relative to the working folder; `sqlite:////abs/path.db`). The default,
  `sqlite:///build/tune/studies.db`, is the one whose folder is made; a given path's folder must exist.
- `postgresql://user@host/db` (`postgresql://user:password@host:port/db`; a unix socket:
  `postgresql://user@/db?host=/run/postgresql`): through psycopg 3 (`pip install "glm53ctl[postgres]"`), whichever
  driver SQLAlchemy's version maps `postgresql://` to (2.0: psycopg2, 2.1: psycopg); `postgresql+psycopg2://`
  asks for psycopg2.
- `path.log` or `path.journal`: an Optuna journal file, which processes on one file system share.

`check_storage` reads the form alone (no file, no connection): the command calls it before anything else.
`storage_of(url)` opens the storage, creating it where it does not exist yet; `storage_of(url, create=False)`
opens only studies that exist (--plots), creating nothing and writing nothing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from glm53ctl.errors import UsageError

DEFAULT_STORAGE = "sqlite:///build/tune/studies.db"
DEFAULT_PATH = DEFAULT_STORAGE.removeprefix("sqlite:///")  # the one storage whose folder is made
JOURNAL_SUFFIXES = (".log", ".journal")
FORMS = (
    "--storage takes sqlite:///path.db, postgresql://user@host/db (pip install 'glm53ctl[postgres]') or a journal "
    "file path.log"
)
# the driver package of each DB-API module SQLAlchemy may import, for the hint
DRIVER_PACKAGES = {
    "psycopg": "'glm53ctl[postgres]' (psycopg[binary])",
    "psycopg2": "psycopg2-binary",
    "pg8000": "pg8000",
    "asyncpg": "asyncpg",
    "pymysql": "PyMySQL",
    "MySQLdb": "mysqlclient",
    "mysql": "mysql-connector-python",
    "oracledb": "oracledb",
    "pyodbc": "pyodbc",
}
CONNECT_TIMEOUT_S = 10  # a host that drops packets: an error in seconds, not a two-minute hang


def shown(url: str) -> str:
    """The URL as messages show it: a password replaced by ***."""
    return re.sub(r"(://[^:/?#@]*):[^@/?#]*@", r"\1:***@", url)


def is_journal(url: str) -> bool:
    return "://" not in url and url.endswith(JOURNAL_SUFFIXES)


def check_storage(url: str, create: bool = True):
    """The storage, read without opening, making or writing anything: a journal file's Path, or the SQLAlchemy
    URL with its driver named (its DB-API module importable); a file that is there is the kind it should be, a
    file that is not has a folder it can go in (`create=False`: it must be there). UsageError otherwise."""
    if is_journal(url):
        path = Path(url)
        _file_ok(f"--storage {url}", path, create, _journal_head_ok, "an Optuna journal file")
        return path
    if "://" not in url:
        raise UsageError(f"--storage {shown(url)}: not a database URL or a journal file (*.log, *.journal)", hint=FORMS)
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    try:
        u = make_url(url)
    except (sqlalchemy.exc.ArgumentError, ValueError) as e:
        raise UsageError(f"--storage {shown(url)}: not a database URL ({e})", hint=FORMS) from None
    if u.drivername == "postgresql":  # the documented form, through the driver the postgres extra installs
        u = u.set(drivername="postgresql+psycopg")
    try:
        dialect = u.get_dialect()
    except sqlalchemy.exc.NoSuchModuleError:
        scheme = u.drivername
        hint = "postgresql://user@host/db (SQLAlchemy's name for PostgreSQL)" if scheme == "postgres" else FORMS
        raise UsageError(
            f"--storage {shown(url)}: no database kind {scheme!r} that SQLAlchemy knows", hint=hint
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        module = (e.name or "").split(".")[0] or u.get_driver_name()
        package = DRIVER_PACKAGES.get(module, module)
        raise UsageError(
            f"--storage {shown(url)}: its driver, the Python module {module!r}, is not installed",
            hint=f"pip install {package}",
        ) from None
    if u.get_backend_name() == "sqlite":
        if (u.database or ":memory:") == ":memory:":
            raise UsageError(
                f"--storage {shown(url)}: an SQLite database in memory; the studies would go with the process",
                hint=f"a file: sqlite:///path.db (the default: {DEFAULT_STORAGE})",
            )
        if not u.database.startswith("file:"):  # an SQLite URI: as it says
            _file_ok(f"--storage {shown(url)}", Path(u.database), create, _sqlite_head_ok, "an SQLite database")
    return u


def _file_ok(what: str, path: Path, create: bool, head_ok, kind: str) -> None:
    """A storage file: one of its kind if there; else (`create`) a folder it can be made in, the default's
    folder one that can be made."""
    if path.is_dir():
        raise UsageError(f"{what}: {path} is a folder, not a file", hint="give the path of a file in it")
    if path.exists():
        try:
            with open(path, "rb") as f:
                head = f.read(1 << 20)
        except OSError as e:
            raise UsageError(f"{what}: cannot read {path}: {e.strerror or e}", hint=f"{kind} you can read") from None
        if head and not head_ok(head):
            raise UsageError(
                f"{what}: {path} is not {kind} (left as it is)",
                hint="give a new file's path, or the storage the studies were run with",
            )
        return
    if not create:
        raise UsageError(f"{what}: no such file {path}, so no studies to read", hint=_which_storage_hint())
    folder = path.parent
    if str(path) == DEFAULT_PATH:  # its folder is made: the nearest folder there must take it
        there = next(p for p in (folder, *folder.absolute().parents) if p.exists())
        if not there.is_dir():
            raise UsageError(f"{what}: {there} is a file, not a folder", hint=_elsewhere_hint())
        if not os.access(there, os.W_OK | os.X_OK):
            raise UsageError(f"{what}: cannot make {folder} in {there} (read-only)", hint=_elsewhere_hint())
        return
    if not folder.exists():
        raise UsageError(f"{what}: no folder {folder}", hint=f"make it first (mkdir -p {folder}), or give another path")
    if not folder.is_dir():
        raise UsageError(f"{what}: {folder} is a file, not a folder", hint="give a path in a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{what}: cannot write in {folder} (read-only)", hint=_elsewhere_hint())


def _elsewhere_hint() -> str:
    return "run tune in a folder you can write to, or give --storage a place that is writable"


def _which_storage_hint() -> str:
    return (
        "give --storage the storage the studies were run with (the default, "
        f"{DEFAULT_STORAGE}, is relative to the folder tune ran in)"
    )


SQLITE_MAGIC = b"SQLite format 3\x00"


def _sqlite_head_ok(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def _journal_head_ok(head: bytes) -> bool:
    """Its first line is one of Optuna's journal records (a JSON object with an op_code)."""
    import json

    line = head.split(b"\n", 1)[0]
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and "op_code" in record


def storage_of(url: str, create: bool = True):
    """Optuna storage from --storage (the module docstring's forms). `create=False`: only studies that exist,
    read (a missing file, or a database without Optuna's tables: UsageError), nothing created or written."""
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    where = check_storage(url, create)
    if isinstance(where, Path):
        return _journal(url, where, create)
    return _database(url, where, create)


def _made(path: Path) -> list[Path]:
    """Make the default storage's folder: the folders made, outermost first (UsageError where it cannot be)."""
    folder = path.parent
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"--storage {DEFAULT_STORAGE}: cannot make {folder}: {e.strerror or e}", hint=_elsewhere_hint()
        ) from None
    return list(reversed(missing))


def _remove(paths: list[Path]) -> None:
    """What a failed open made (folders, an empty file), innermost first; what is not there or not empty stays
    (a database another worker filled meanwhile)."""
    for p in reversed(paths):
        try:
            if p.is_dir():
                p.rmdir()
            elif p.exists() and p.stat().st_size == 0:
                p.unlink()
        except OSError:
            pass


def _journal(url: str, path: Path, create: bool):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    what = f"--storage {url}"
    made = [] if path.exists() else [path]
    try:
        storage = JournalStorage(JournalFileBackend(str(path)))
        storage.get_all_studies()  # reads the journal through: a file that is not one fails here, not mid-run
    except OSError as e:
        _remove(made)
        raise UsageError(
            f"{what}: cannot open it: {e.strerror or e}", hint="a journal file you can read and write"
        ) from None
    except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        _remove(made)
        raise UsageError(
            f"{what}: not an Optuna journal file ({type(e).__name__}: {e}; left as it is)",
            hint="give a new file's path, or the journal the studies were run with",
        ) from None
    return storage


def _database(url: str, u, create: bool):
    import optuna
    import sqlalchemy
    import sqlalchemy.exc

    what = f"--storage {shown(url)}"
    engine_kwargs: dict = {}
    made: list[Path] = []
    if u.get_backend_name() == "sqlite" and not u.database.startswith("file:"):
        path = Path(u.database)
        if not path.exists():
            made = (_made(path) if str(path) == DEFAULT_PATH else []) + [path]
        if not create:  # opened read-only: a plot writes nothing, whatever Optuna would do on opening
            import sqlite3
            import urllib.parse

            ro = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
            engine_kwargs["creator"] = lambda: sqlite3.connect(ro, uri=True, check_same_thread=False)
    elif u.get_backend_name() == "postgresql" and "connect_timeout" not in u.query:
        engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    rendered = u.render_as_string(hide_password=False)
    try:
        if not create:
            engine = sqlalchemy.create_engine(rendered, **engine_kwargs)
            try:
                if not sqlalchemy.inspect(engine).has_table("studies"):
                    raise UsageError(f"{what}: no studies in it (no Optuna tables)", hint=_which_storage_hint())
            finally:
                engine.dispose()
        # workers that start together on a fresh database race to create its tables: the loser retries
        for attempt in range(5):
            try:
                return optuna.storages.RDBStorage(
                    rendered, engine_kwargs=engine_kwargs, heartbeat_interval=60, grace_period=120
                )
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
    except sqlalchemy.exc.SQLAlchemyError as e:
        _remove(made)
        raise _database_error(what, u, e) from None
    except RuntimeError as e:  # optuna: the tables of another version of Optuna's schema
        _remove(made)
        raise UsageError(
            f"{what}: {str(e).splitlines()[0]}", hint=f"optuna storage upgrade --storage '{shown(url)}'"
        ) from None
    except UsageError:
        _remove(made)
        raise


def _database_error(what: str, u, e) -> UsageError:
    """A database that cannot be opened, in the driver's own words (its first line) and what to check."""
    orig = getattr(e, "orig", None) or e
    first = next((ln.strip() for ln in str(orig).splitlines() if ln.strip()), type(orig).__name__)
    backend = u.get_backend_name()
    if backend == "sqlite":
        if "not a database" in first:
            return UsageError(
                f"{what}: {u.database} is not an SQLite database (left as it is)", hint=_which_storage_hint()
            )
        return UsageError(f"{what}: cannot open {u.database}: {first}", hint="an SQLite file you can read and write")
    if backend == "postgresql":
        at = u.query.get("host") or u.host or "localhost"
        at = at if isinstance(at, str) else ",".join(at)
        port = u.query.get("port") or u.port or 5432
        port = port if isinstance(port, str | int) else ",".join(port)
        return UsageError(
            f"{what}: cannot open it: {first}",
            hint=f"is a PostgreSQL server running at {at} port {port}, and does database {u.database!r} exist there "
            f"with user {u.username or os.environ.get('USER', '?')!r} allowed in? (createdb -h {at} -p {port} "
            f"{u.database})",
        )
    return UsageError(f"{what}: cannot open it: {first}", hint=f"is the {backend} database there, and reachable?")
