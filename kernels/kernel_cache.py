"""The kernel cache that a CPU build carries to a GPU: build once with no GPU, launch there without compiling.

`glm53ctl build` compiles every kernel of its keys for a target (kernels/build.py) and writes each into the
cache folder (`build/kernels` by default): `CACHE.json` says which Triton, target and ptxas built it, and one
folder per kernel holds Triton's own metadata and cubin with `entry.json` (their sha256, the specialization).

A kernel's name there is Triton's own cache key (`triton.runtime.cache.get_cache_key`: the source and its
callees, the signature and its specialization, constexprs, options, the backend's ptxas and arch, the
cache-invalidating environment) with Triton's version in place of `triton_key()`, a hash of the installed
package's files that differs between two Python builds of one Triton version; hashed, that is the entry's
digest. Nothing here derives a key by hand: the build and the JIT hand Triton's key function their sources.

On the GPU, `--cache DIR` (or `GLM53CTL_KERNEL_CACHE`, which worker processes inherit) installs Triton's
`jit_cache_hook`: before the JIT compiles a kernel it derives the digest for the real arguments; where the
folder holds it, the entry is verified and put into Triton's own file cache under this installation's key, and
the JIT's compile finds it there. Anything else compiles as without a cache. Triton's compilation listener
counts, per key (`counting`), the kernels loaded from the carried cache, found in this machine's own Triton cache,
and compiled (with the seconds), in this process and, through `GLM53CTL_KERNEL_LOG`, in its workers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from glm53ctl import __version__
from glm53ctl.errors import UsageError
from glm53ctl.files import write_atomic

FORMAT = 1
HEADER = "CACHE.json"
ENTRY = "entry.json"
ENV_CACHE = "GLM53CTL_KERNEL_CACHE"
ENV_LOG = "GLM53CTL_KERNEL_LOG"
ENV_OWNER = "GLM53CTL_KERNEL_LOG_OWNER"  # the process that reads the log (its own counts are in memory)
# what the build compiles under (kernels/build.py: code hashes free of paths); a launch with a cache does too, or
# no key would match (line info changes the debug sections only, not the code)
LINE_INFO = "TRITON_DISABLE_LINE_INFO"


# --- the key --------------------------------------------------------------------------------------------------


def digest(src, backend, options, env_vars: dict | None = None) -> str:
    """An entry's name: Triton's cache key of `src` built by `backend` with `options` (parsed), its installation
    hash replaced by its version."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_key, triton_key

    env = get_cache_invalidating_env_vars() if env_vars is None else env_vars
    key = get_cache_key(src, backend, options, env)
    installed = triton_key()
    assert key.startswith(installed), "Triton's cache key no longer starts with triton_key()"
    return hashlib.sha256((triton.__version__ + key[len(installed) :]).encode()).hexdigest()


def settle_keys() -> None:
    """Give every kernel function this process has loaded the cache key it has in every other process.

    Triton 3.6 derives a function's key (`JITFunction.cache_key`) once, merging each callee's used global values
    before it derives the callee's key (`DependenciesFinder._update_hash`): a callee whose key another kernel
    derived first brings its globals into the caller's key, one reached first from this kernel does not. So a
    kernel's key depended on which kernels were keyed before it in the process (tail's after embed's differs from
    tail's alone), and a kernel built in one process missed in another, Triton's own file cache too. Here every
    key is derived again until none changes: each function's globals are then all its callees', in any order."""
    import sys

    from triton.runtime.jit import JITFunction

    fns = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith(("glm53ctl", "tests")) and mod is not None:
            for v in list(vars(mod).values()):
                if isinstance(v, JITFunction):
                    fns[id(v)] = v
    if len(fns) == _state.settled:
        return
    order = sorted(fns.values(), key=lambda f: (f.fn.__module__, f.fn.__qualname__))
    before = None
    while True:
        for f in order:
            f.hash = None
        keys = [f.cache_key for f in order]
        if keys == before:
            break
        before = keys
    _state.settled = len(fns)


def local_hash(src, backend, options) -> str:
    """Where Triton's own file cache keeps `src` on this machine (what `triton.compile` looks up)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_key

    key = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode()).hexdigest()


def toolchain(target: int) -> dict:
    """What a cache must share with the machine that loads it: Triton's version, the target, the backend's hash
    (ptxas version and arch) and the cache-invalidating environment."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return {
        "triton": triton.__version__,
        "target": f"sm_{target}",
        "backend": make_backend(GPUTarget("cuda", target, 32)).hash(),
        "env": dict(sorted(get_cache_invalidating_env_vars().items())),
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- writing (the build) ----------------------------------------------------------------------------------------


def write_header(root: Path, target: int) -> None:

    root.mkdir(parents=True, exist_ok=True)
    head = {"format": FORMAT, "glm53ctl": __version__} | toolchain(target)
    write_atomic(root / HEADER, json.dumps(head, indent=2) + "\n")


def entry_name(src, target: int, options: dict) -> str:
    """The digest `src` compiled for `target` with `options` is carried under (options as triton.compile takes
    them: it parses them again, as it does here)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", target, 32))
    return digest(src, backend, backend.parse_options(dict(options, **src.parse_options())))


def has_entry(root: Path, name: str) -> bool:
    """Whether the cache holds `name` whole (each file as its sha256 says): a damaged one is built again."""
    try:
        meta = json.loads((root / name / ENTRY).read_text())
        return all(_sha(root / name / f) == sha for f, sha in meta["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def write_entry(root: Path, name: str, compiled, src, options) -> None:
    """Put one compiled kernel (triton.compile's result, `src` its ASTSource) into the cache as `name`. An entry is
    made in a temporary folder and renamed into place: a reader sees all of it or none."""
    final = root / name
    if has_entry(root, name):
        return
    files = {Path(p).name: Path(p) for f, p in compiled.metadata_group.items() if f.endswith((".json", ".cubin"))}
    tmp = Path(tempfile.mkdtemp(prefix=f".{name[:12]}.", dir=root))
    try:
        for fname, path in files.items():
            shutil.copyfile(path, tmp / fname)
        entry = {
            "format": FORMAT,
            "kernel": compiled.metadata.name,
            "function": f"{src.fn.module}.{src.fn.__name__}",
            "files": {fname: _sha(tmp / fname) for fname in sorted(files)},
            "specialization": describe(src, options),
        }
        (tmp / ENTRY).write_text(json.dumps(entry, indent=1) + "\n")
        shutil.rmtree(final, ignore_errors=True)  # a damaged entry of the same name: replaced
        try:
            tmp.rename(final)
        except OSError:  # another process put the same kernel first: theirs is as good
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def describe(src, options) -> dict:
    """A kernel's specialization in words (argument: type or constant), for naming what differs at a miss."""
    names = src.fn.arg_names
    sig = {n: str(t) for n, t in src.signature.items()}
    for path, v in src.constants.items():
        n = names[path[0]] + "".join(f"[{i}]" for i in path[1:])
        sig[n] = f"= {getattr(v, 'cache_key', v)!s}"
    for path, attrs in src.attrs.items():
        n = names[path[0]] + "".join(f"[{i}]" for i in path[1:])
        sig[n] = f"{sig.get(n, '')} {attrs}".strip()
    opts = {k: str(v) for k, v in sorted(vars(options).items()) if k != "extern_libs"}
    return {"args": sig, "options": opts}


# --- reading (a command that launches) ---------------------------------------------------------------------------


def open_cache(path: Path, flag: str = "--cache") -> Path:
    """A cache folder given on the command line: exit 2 unless it is a readable kernel cache."""
    if not path.exists():
        raise UsageError(f"{flag} {path}: no such folder", hint="glm53ctl build --out DIR writes one in DIR/kernels")
    if not path.is_dir():
        raise UsageError(f"{flag} {path}: not a folder")
    head = path / HEADER
    if not os.access(path, os.R_OK | os.X_OK) or (head.exists() and not os.access(head, os.R_OK)):
        raise UsageError(f"{flag} {path}: cannot read it", hint="a folder you may read")
    if not head.is_file():
        raise UsageError(
            f"{flag} {path}: not a kernel cache (no {HEADER})",
            hint="glm53ctl build writes one in its --out folder's kernels/ (build/kernels); "
            "--against's worktrees are --worktrees DIR",
        )
    try:
        json.loads(head.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {path}: {HEADER} is not readable JSON ({e})") from None
    return path.resolve()


@dataclass
class Counts:
    """What one key's launches took from where: the carried cache, this machine's Triton cache, the compiler."""

    loaded: int = 0
    reused: int = 0
    compiled: int = 0
    compile_s: float = 0.0
    misses: list[str] = field(default_factory=list)  # a carried cache's misses, each in words

    def add(self, other: Counts) -> None:
        self.loaded += other.loaded
        self.reused += other.reused
        self.compiled += other.compiled
        self.compile_s += other.compile_s
        self.misses += [m for m in other.misses if m not in self.misses]

    def as_dict(self) -> dict:
        return {
            "loaded": self.loaded,
            "reused": self.reused,
            "compiled": self.compiled,
            "compile_s": round(self.compile_s, 2),
            "misses": self.misses,
        }


class _State:
    """This process's cache (if any), its warnings, the key being worked on and the counts so far."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.usable = False
        self.checked = False
        self.label = "-"
        self.counts: dict[str, Counts] = {}
        self.installed: set[str] = set()  # the folders of Triton's cache this process put kernels into
        self.misses: dict[str, str] = {}  # local hash -> why the carried cache had nothing for it
        self.warned: set[str] = set()
        self.settled = 0  # how many kernel functions `settle_keys` last settled


_state = _State()


def _warn(message: str) -> None:
    if message in _state.warned:
        return
    _state.warned.add(message)
    import sys

    sys.stderr.write(f"Warning: {message}\n")
    sys.stderr.flush()


def activate(root: Path | None = None) -> None:
    """Count compiles in this process (Triton's compilation listener) and, with a cache (`root`, else
    $GLM53CTL_KERNEL_CACHE), load its kernels (Triton's jit_cache_hook). The cache and a log of the counts pass to
    worker processes through the environment. Not in the interpreter: nothing compiles there."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    from triton import knobs

    if root is not None:
        os.environ[ENV_CACHE] = str(root)
    env = os.environ.get(ENV_CACHE)
    if env:
        if os.environ.get(LINE_INFO) is None:
            os.environ[LINE_INFO] = "1"  # as the build compiled (set before Triton reads it: knobs read the env)
        _state.root, _state.checked = Path(env), False
    knobs.runtime.jit_cache_hook = _hook  # the keys settled before any compile; with a cache, its kernels loaded
    knobs.compilation.listener = _listen


def from_env() -> None:
    """In a worker process: what its parent activated (kernels/tlx.py calls this as kernels load)."""
    if os.environ.get(ENV_CACHE) or os.environ.get(ENV_LOG):
        activate()


@contextlib.contextmanager
def counting(label: str):
    """Count what the launches inside compile or load under `label` (a key's name)."""
    before, _state.label = _state.label, label
    try:
        yield
    finally:
        _state.label = before


def _check_header(target) -> bool:
    """Once per process: whether the cache was built for this Triton, target, ptxas and environment (`toolchain`,
    as the build wrote it); a one-line warning where not (every kernel then compiles here)."""
    root = _state.root
    try:
        head = json.loads((root / HEADER).read_text())
    except (OSError, ValueError) as e:
        _warn(f"kernel cache {root}: {HEADER} unreadable ({e}); every kernel compiles here")
        return False
    here = toolchain(target.arch)
    what = {"triton": "Triton", "target": "target", "backend": "ptxas", "env": "Triton environment"}
    for k, name in what.items():
        if head.get(k) != here[k]:
            _warn(
                f"kernel cache {root} was built for {name} {head.get(k)}, this machine has {here[k]}: "
                "every kernel compiles here"
            )
            return False
    return True


def _hook(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    """Triton's jit_cache_hook: before the JIT compiles, put the carried kernel (if any) into Triton's own cache
    under this installation's key. Returns None: the JIT goes on, and its compile finds the kernel or builds it."""
    from triton.compiler import ASTSource

    settle_keys()  # before Triton derives the function's key, in this process as in the build's
    jf = fn.jit_function
    _, _, target, backend, _ = jf.device_caches[compile["device"]]
    if _state.root is None:
        return None
    if not _state.checked:
        _state.usable, _state.checked = _check_header(target), True
    data = json.loads(compile["specialization_data"])
    # as Triton's own JITFunction.preload reads them back
    options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v for k, v in data["options"].items()})
    src = ASTSource(jf, compile["signature"], compile["constants"], compile["configs"][0])
    here = local_hash(src, backend, options)
    if not _state.usable:
        _state.misses[here] = "the cache is for another toolchain"
        return None
    name = digest(src, backend, options)
    entry = _state.root / name
    if not (entry / ENTRY).is_file():
        _state.misses[here] = _why_missing(src, options)
        return None
    files = _verified(entry)
    if files is None:
        _state.misses[here] = f"{jf.__name__}: its entry {name[:12]} is damaged"
        return None
    from triton.runtime.cache import get_cache_manager

    manager = get_cache_manager(here)
    group = {f: manager.put(data, f, binary=not f.endswith(".json")) for f, data in files.items()}
    manager.put_group(f"{src.name[:150]}.json", group)
    _state.installed.add(_base32(here))
    return None


def _base32(h: str) -> str:
    """A local hash as Triton's file cache names its folder."""
    import base64

    return base64.b32encode(bytes.fromhex(h)).decode().rstrip("=")


def _verified(entry: Path) -> dict[str, bytes] | None:
    """An entry's files, each checked against its sha256; None (and a warning naming it) where one is missing,
    truncated or changed."""
    try:
        meta = json.loads((entry / ENTRY).read_text())
        files = {f: (entry / f).read_bytes() for f in meta["files"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        _warn(f"kernel cache entry {entry} is unreadable ({type(e).__name__}: {e}); compiling it here")
        return None
    bad = [f for f, data in files.items() if hashlib.sha256(data).hexdigest() != meta["files"][f]]
    if bad or not any(f.endswith(".cubin") for f in files):
        _warn(f"kernel cache entry {entry} is corrupt ({', '.join(bad) or 'no cubin'}); compiling it here")
        return None
    return files


def _why_missing(src, options) -> str:
    """What a miss differs in from the carried builds of the same function (the closest one), in words."""
    fn = f"{src.fn.module}.{src.fn.__name__}"
    ours = describe(src, options)
    best = None
    for meta_path in _state.root.glob(f"*/{ENTRY}"):
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("function") != fn:
            continue
        theirs = meta.get("specialization", {})
        diff = [
            f"{n}: {_short(ours[part].get(n, '-'))} here, {_short(theirs.get(part, {}).get(n, '-'))} built"
            for part in ("args", "options")
            for n in sorted(set(ours[part]) | set(theirs.get(part, {})))
            if ours[part].get(n) != theirs.get(part, {}).get(n)
        ]
        if best is None or len(diff) < len(best):
            best = diff
    if best is None:
        return f"{src.fn.__name__}: not built ahead"
    if not best:
        return f"{src.fn.__name__}: built for another source or toolchain"
    return f"{src.fn.__name__}: another specialization ({'; '.join(best[:3])})"


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _listen(*, src, metadata, metadata_group, times, cache_hit):
    """Triton's compilation listener: one kernel loaded (ours), reused (this machine's cache) or compiled."""
    c = Counts()
    if cache_hit:
        # Triton's file cache keeps a kernel's files in <cache dir>/<base32 of its local hash>/
        folders = {Path(p).parent.name for p in metadata_group.values()}
        c.loaded, c.reused = (1, 0) if folders & _state.installed else (0, 1)
    else:
        c.compiled = 1
        c.compile_s = (times.ir_initialization + sum(t for _, t in times.lowering_stages) + times.store_results) / 1e6
        why = _state.misses.get(metadata.get("hash", ""))
        if why:
            c.misses.append(why)
    _record(c)


def _record(c: Counts) -> None:
    _state.counts.setdefault(_state.label, Counts()).add(c)
    log = os.environ.get(ENV_LOG)
    if log and os.environ.get(ENV_OWNER) != str(os.getpid()):  # a worker's counts reach its parent in the log
        with contextlib.suppress(OSError), open(log, "a") as f:
            f.write(json.dumps({"label": _state.label} | c.as_dict()) + "\n")


@contextlib.contextmanager
def tallied():
    """Around a command: its counts per key, this process's and its workers' (through a log file they append to).
    Yields a function that returns them so far."""
    fd, log = tempfile.mkstemp(prefix="glm53ctl-kernels-", suffix=".jsonl")
    os.close(fd)
    saved = {k: os.environ.get(k) for k in (ENV_LOG, ENV_OWNER)}
    os.environ[ENV_LOG] = log
    os.environ[ENV_OWNER] = str(os.getpid())
    activate()

    def so_far() -> dict[str, Counts]:
        out: dict[str, Counts] = {}
        for label, c in _state.counts.items():
            out.setdefault(label, Counts()).add(c)
        with contextlib.suppress(OSError):
            for line in Path(log).read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError):
                    d = json.loads(line)
                    c = Counts(d["loaded"], d["reused"], d["compiled"], d["compile_s"], d["misses"])
                    out.setdefault(d["label"], Counts()).add(c)
        return out

    try:
        yield so_far
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with contextlib.suppress(OSError):
            os.unlink(log)
