"""Ahead-of-time builds of every kernel per build key (docs/design.md §2, §4), on a machine with no GPU.

A build key is (model, kind, tp, rows) with the knobs in force for it, resolved by the command (kernels/key.py;
a grid of 0 builds for an H200's 396 programs: `for_build`). Each key's launches (the launch
itself and, at TP > 1, the peers' partial launch) are compiled for a GPU target with `triton.compile`,
specialized exactly as Triton's JIT would specialize the same arguments; `ptxas -v` reports registers,
spills and stack. Results are cached by what determines the code: the kernel source and its callees
(Triton's cache key), the signature and specialization, constexprs, options, target and Triton version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from glm53ctl import __version__
from glm53ctl.errors import Glm53Error, UsageError
from glm53ctl.files import write_atomic
from glm53ctl.interrupts import interrupted, worker_pool
from glm53ctl.kernels import kernel_cache
from glm53ctl.kernels.key import ResolvedKey
from glm53ctl.kernels.kinds import load_harness
from glm53ctl.kernels.runtime.stages import SeparateLaunches
from glm53ctl.kernels.spec import load_model
from glm53ctl.worktree import finder_code, this_tree

# grid 0 resolves per device: a build, for no device, takes an H200's (3 x 132; kda_split 0 reads it)
BUILD_GRID = 396


class BuildError(Glm53Error):
    """A kernel did not compile: names the key and carries the compiler's message."""

    exit_code = 1


def for_build(key: ResolvedKey) -> ResolvedKey:
    """A key resolved for no device, as a build compiles it: a grid of 0 is an H200's."""
    return key.with_knobs({"grid": BUILD_GRID}) if key.knobs.grid == 0 else key


@dataclass
class KernelRecord:
    role: str  # "launch", or "peer" (the peers' partial launch at TP > 1)
    symbol: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared: int
    stack: int
    hash: str  # of the cubin, built without line info: stable across checkouts
    compile_s: float
    cached: bool = False
    # of the PTX with its functions' mangled names (which carry the module a function is defined in) numbered in
    # order of appearance: equal where only names differ. ptxas allocates registers differently for other names,
    # so a moved function can change the cubin (and the speed, by a few percent: docs/perf/path/) with the same code
    code: str = ""
    # of the machine code (the cubin's SASS, as nvdisasm prints it) with this project's functions' names numbered
    # as in `code`: equal where the cubins differ in names alone, so the speed cannot ("" without nvdisasm)
    sass: str = ""


# what this build reports on: Triton 3.6 builds for NVIDIA GPUs of capability 8.0 and newer, and its wheel's ptxas
# (CUDA 12.8), which gives the resources, reads the PTX it makes for these; for 10.0 and newer Triton uses another
# ptxas and a newer PTX version that this one refuses
TARGETS = (80, 86, 87, 89, 90)


# what a cached record holds: 2 added `code`, 3 `sass` (a record without them is built again)
RECORD_FORMAT = 3

# a mangled Triton function name (or one of its parameters): the module path and name, `.` spelled `_$_`
_MANGLED = re.compile(r"glm53ctl_\$_[A-Za-z0-9_$]+")


def unnamed_ptx(ptx: str) -> str:
    """PTX with every mangled name of this project's functions replaced by its number in order of first
    appearance: what is left is the code."""
    names: dict[str, str] = {}
    return _MANGLED.sub(lambda m: names.setdefault(m.group(0), f"f{len(names)}"), ptx)


def unnamed_sass(cubin: bytes, nvdisasm: Path | None) -> str:
    """The cubin's machine code as nvdisasm prints it, without comments (addresses, encodings) and with spaces
    collapsed: the kernel's entry, then each noinline function in the order the code reaches it, this project's
    functions' names numbered in that order and each function's local labels in its own: equal where only the
    names differ (a name can move a function within the cubin, and with it the labels' numbers). "" without
    nvdisasm."""
    if nvdisasm is None:
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        p = subprocess.run([str(nvdisasm), "-c", f.name], capture_output=True, text=True)
    if p.returncode:
        raise BuildError(f"nvdisasm failed: {p.stderr.strip()}")
    blocks: dict[str, list[str]] = {"": []}  # "" the entry's (and the file's header), then a block a function
    body = blocks[""]
    for line in (" ".join(re.sub(r"/\*.*?\*/", "", line).split()) for line in p.stdout.splitlines()):
        if (m := re.fullmatch(r"\$\w+\$(glm53ctl_\$_\S+):", line)) is not None:  # a noinline function's entry
            body = blocks.setdefault(m.group(1), [])
        if line and not line.startswith("//"):
            body.append(line)
    order = [""]  # breadth first from the entry: the order the code reaches each function, whatever its name
    for name in order:
        for m in _MANGLED.finditer("\n".join(blocks.get(name, []))):
            if m.group(0) not in order:
                order.append(m.group(0))
    number = {name: f"f{i}" for i, name in enumerate(order)}
    return "\n".join(
        _numbered(r"\.L_x_\d+", _MANGLED.sub(lambda m: number[m.group(0)], "\n".join(blocks[name])), ".L")
        for name in order
        if name in blocks
    )


def sass_of_cached(kernels: Path, entry: str, nvdisasm: Path | None) -> str:
    """`unnamed_sass`'s digest of a kernel cache entry's cubin ("" where it is not there)."""
    cubins = sorted((kernels / entry).glob("*.cubin"))
    return _digest(unnamed_sass(cubins[0].read_bytes(), nvdisasm)) if cubins else ""


def fill_sass(manifest: dict, kernels: Path) -> None:
    """The machine code's digest (`sass`) of each kernel a manifest did not record it for (a build by a tree
    before it was recorded), from that build's kernel cache `kernels`: so `build --against` an older ref can
    still tell renamed from reallocated."""
    nvdisasm = find_nvdisasm(find_ptxas())
    for key in manifest["keys"]:
        for rec in key["kernels"]:
            if not rec.get("sass") and rec.get("entry"):
                rec["sass"] = sass_of_cached(kernels, rec["entry"], nvdisasm)


def _numbered(pattern: str, text: str, prefix: str) -> str:
    """`text` with each match of `pattern` replaced by `prefix` and its number in order of first appearance."""
    seen: dict[str, str] = {}
    return re.sub(pattern, lambda m: seen.setdefault(m.group(0), f"{prefix}{len(seen)}"), text)


def parse_target(target: str) -> int:
    m = re.fullmatch(r"sm_(\d+)a?", target)
    if not m:
        raise UsageError(f"--target {target!r}: expected sm_<capability>, e.g. sm_90")
    capability = int(m.group(1))
    if capability not in TARGETS:
        raise UsageError(
            f"--target {target!r}: not a target Triton builds for",
            hint=f"one of {', '.join(f'sm_{c}' for c in TARGETS)}",
        )
    return capability


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""


def find_nvdisasm(ptxas: Path) -> Path | None:
    """nvdisasm beside ptxas (the triton wheel ships both), or None."""
    path = ptxas.with_name("nvdisasm")
    return path if path.is_file() and os.access(path, os.X_OK) else None


def find_ptxas() -> Path:
    env = os.environ.get("TRITON_PTXAS_PATH")
    if env:
        path = Path(env)
    else:
        import triton

        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(
            f"no ptxas at {path}", hint="the triton wheel ships one; or set TRITON_PTXAS_PATH to a CUDA ptxas"
        )
    return path


def launches(key: ResolvedKey) -> list[tuple[str, object]]:
    """The launch objects of one key (laid out on the CPU; nothing runs): the kind harness's."""

    spec = load_model(key.model)
    spec.check_tp(key.tp)
    return load_harness(key.kind).build_launches(spec, key)


def _source(launch, target: int):
    """A launch's kernel as Triton's JIT would compile it for these argument values on a `target` GPU: the JIT's
    own binder specializes them (value 1 a constant, multiples of 16 and aligned pointers divisible, in an
    argument's groups too) and its `_pack_args` makes the signature, constexprs, attributes and options, as
    `JITFunction.run` does before it compiles. Returns the function, its ASTSource and the options (parsed)."""
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    backend = make_backend(GPUTarget("cuda", target, 32))
    kwargs = launch.placeholder_args() | launch.constexprs() | launch.options()
    # as JITFunction.run sets them before it binds
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return fn, ASTSource(fn, signature, constexprs, attrs), options


def _toolchain(ptxas: Path) -> list:
    """What else decides the code: the ptxas binary and Triton's cache-invalidating environment."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    st = ptxas.stat()
    return [str(ptxas), st.st_size, int(st.st_mtime), sorted(get_cache_invalidating_env_vars().items())]


def _ptxas_report(ptxas: Path, ptx: str) -> dict:
    arch = re.search(r"^\.target\s+(\w+)", ptx, re.M).group(1)
    p = subprocess.run(
        [str(ptxas), f"-arch={arch}", "-v", "-", "-o", os.devnull], input=ptx, capture_output=True, text=True
    )
    if p.returncode:
        raise BuildError(f"ptxas failed: {p.stderr.strip()}")
    return parse_ptxas(p.stderr)


def parse_ptxas(text: str) -> dict:
    """Registers, stack and spills from `ptxas -v`'s report of one kernel (0 where a figure is absent)."""
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, text)) else 0
    return {
        "registers": num(r"Used (\d+) registers"),
        "stack": num(r"(\d+) bytes stack frame"),
        "spill_stores": num(r"(\d+) bytes spill stores"),
        "spill_loads": num(r"(\d+) bytes spill loads"),
    }


def compile_key(key: ResolvedKey, target: int, cache_dir: str, variants=(), kernels_dir: str | None = None) -> dict:
    """Compile every kernel of one key (in a worker process): its launches' KernelRecord dicts, and each launch of
    its `variants` (`carried_launches`) as a `carried` list, every kernel also put into the kernel cache
    `kernels_dir` (kernels/kernel_cache.py) that a GPU machine loads."""
    os.environ.pop("TRITON_INTERPRET", None)  # the JIT decorators must build real kernels here
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # keeps code hashes free of paths

    ptxas = find_ptxas()
    kernels = Path(kernels_dir) if kernels_dir else None
    records = [_compile_one(role, la, target, Path(cache_dir), kernels, ptxas, key) for role, la in launches(key)]
    carried = []
    for name, vkey in variants:
        for role, la in carried_launches(key, name, vkey):
            try:
                rec = _compile_one(role, la, target, Path(cache_dir), kernels, ptxas, key, report=False)
                carried.append(rec | {"variant": name})
            except BuildError as e:  # a baseline this model's sizes cannot build: said, the key's own builds stand
                carried.append({"variant": name, "role": role, "error": getattr(e, "root", e.message)[:300]})
    return {"kernels": records, "carried": carried}


def carried_launches(key: ResolvedKey, name: str, vkey: ResolvedKey) -> list[tuple[str, object]]:
    """The launches of one variant of a key that a command makes on a GPU: `separate`/`separate-pdl` (the
    baselines: the key's persistent launch cut at its stages, each stage a launch), `steps=1` (a step timed one
    step at a time: its caches' capacity), else `vkey`'s own."""
    if name == "steps=1":
        return load_harness(key.kind).build_launches(load_model(key.model), vkey, steps=1)
    if name not in ("separate", "separate-pdl"):
        return launches(vkey)

    harness = load_harness(key.kind)
    whole = next(la for role, la in launches(vkey) if role == "launch")
    chain = SeparateLaunches(whole, harness.stages(vkey.knobs), pdl=name == "separate-pdl")
    return [(f"stage{j}", s) for j, s in enumerate(chain.stages)]


def _compile_one(
    role: str, launch, target: int, cache_dir: Path, kernels: Path | None, ptxas: Path, key, report: bool = True
) -> dict:
    """One launch's kernel: its record from the build's cache where the same code was built (and is in the kernel
    cache), else compiled, put into the kernel cache and (`report`: a key's own launches, not the variants the
    cache carries beside them) its resources read by ptxas, which takes as long again."""
    import triton
    from triton.backends.compiler import GPUTarget

    kernel_cache.settle_keys()  # the keys every other process derives (kernel_cache.settle_keys)
    fn, src, parsed = _source(launch, target)
    options = parsed.__dict__
    spec = (src.signature, src.constants, src.attrs)
    ident = json.dumps(
        [fn.cache_key, repr(spec), launch.options(), target, triton.__version__, _toolchain(ptxas), RECORD_FORMAT],
        sort_keys=True,
    )
    cached = cache_dir / f"{hashlib.sha256(ident.encode()).hexdigest()}.json"
    entry = kernel_cache.entry_name(src, target, options)
    carried = kernels is not None and kernel_cache.has_entry(kernels, entry)
    if cached.exists() and (kernels is None or carried):
        return json.loads(cached.read_text()) | {"role": role, "cached": True, "entry": entry}
    if carried and not report:  # in the kernel cache already; no resources asked for
        meta = json.loads((kernels / entry / kernel_cache.ENTRY).read_text())
        return {"role": role, "symbol": meta["kernel"], "compile_s": 0.0, "cached": True, "entry": entry}
    t0 = time.perf_counter()
    try:
        compiled = triton.compile(src, target=GPUTarget("cuda", target, 32), options=options)
    except Exception as e:  # the compiler's own message, whatever its type, and the one beneath it
        root = e
        while root.__cause__ is not None:
            root = root.__cause__
        why = "" if root is e else f" ({type(root).__name__}: {root})"
        err = BuildError(f"{key.name} ({role}): {type(e).__name__}: {e}{why}")
        err.root = f"{type(root).__name__}: {root}"
        raise err from None
    seconds = time.perf_counter() - t0
    if kernels is not None:
        kernel_cache.write_entry(kernels, entry, compiled, src, parsed)
    if not report:
        return {"role": role, "symbol": compiled.metadata.name, "compile_s": round(seconds, 3)} | {
            "cached": False,
            "entry": entry,
        }
    rep = _ptxas_report(ptxas, compiled.asm["ptx"])
    rec = asdict(
        KernelRecord(
            role=role,
            symbol=compiled.metadata.name,
            shared=compiled.metadata.shared,
            hash=hashlib.sha256(compiled.asm["cubin"]).hexdigest()[:16],
            code=hashlib.sha256(unnamed_ptx(compiled.asm["ptx"]).encode()).hexdigest()[:16],
            sass=_digest(unnamed_sass(compiled.asm["cubin"], find_nvdisasm(ptxas))),
            compile_s=round(seconds, 3),
            **rep,
        )
    )
    write_atomic(cached, json.dumps(rec))  # keys of the same code share an entry: never half-written
    return rec | {"entry": entry}


def build(keys: list[ResolvedKey], target: int, out: Path, jobs: int, progress=None, variants=None) -> dict:
    """Compile `keys` with `jobs` worker processes; the manifest (also written to out/manifest.json). Every kernel
    also goes into the kernel cache out/kernels (kernels/kernel_cache.py), with those of each key's `variants`
    (key -> [(name, resolved key)]: what the commands launch of it besides its own launches)."""
    from concurrent.futures import as_completed

    import triton

    find_ptxas()
    for key in keys:  # refuse a key the model cannot shard before any work
        load_model(key.model).check_tp(key.tp)

    cache = out / "cache"
    kernels = out / "kernels"
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # as the workers compile (compile_key): the header says so
    kernel_cache.write_header(kernels, target)
    variants = variants or {}
    t0 = time.perf_counter()
    results: dict[ResolvedKey, dict] = {}

    # workers import this tree's kernels even when another glm53ctl is installed (--against runs a ref's tree), and
    # build real ones: the JIT decorators read TRITON_INTERPRET when a kernel's module is imported, so it goes first;
    # whatever the compiler prints goes to stderr: stdout carries the manifest (--json) alone
    init = "import os\nos.dup2(2, 1)\nos.environ.pop('TRITON_INTERPRET', None)\n" + finder_code(this_tree())
    try:
        with worker_pool(jobs, init) as pool:
            futures = {
                pool.submit(compile_key, k, target, str(cache), variants.get(k, ()), str(kernels)): k for k in keys
            }
            for f in as_completed(futures):
                results[futures[f]] = f.result()
                if progress:
                    progress(futures[f])
    except KeyboardInterrupt:  # the workers are stopped; what each finished is in the cache (written whole)
        of = f"{len(keys)} key{'s' if len(keys) != 1 else ''}"
        raise interrupted(
            f"{len(results)} of {of} built, kept in {cache} (a rerun takes them free); "
            f"{out / 'manifest.json'} not written: it would leave the other keys out"
        ) from None
    entries = [
        {"model": k.model, "kind": k.kind, "tp": k.tp, "rows": k.rows, "key": k.name, "knobs": dict(k.knobs)}
        | {"context": k.context}
        | results[k]
        for k in sorted(keys, key=lambda k: (k.model, k.kind, k.tp, k.rows, k.context or 0))
    ]
    records = [r for e in entries for r in e["kernels"]]
    built = [r for e in entries for r in e["kernels"] + e["carried"] if "error" not in r]
    carried = {r["entry"] for r in built}
    manifest = {
        "glm53ctl": __version__,
        "triton": triton.__version__,
        "target": f"sm_{target}",
        "kernel_cache": str(kernels),
        "seconds": round(time.perf_counter() - t0, 2),
        "keys": entries,
        "totals": {
            "keys": len(entries),
            "kernels": len(records),
            "distinct_symbols": len({r["hash"] for r in records}),
            "compiled": sum(not r["cached"] for r in built),
            "compile_s": round(sum(r["compile_s"] for r in built if not r["cached"]), 2),
            "max_registers": max((r["registers"] for r in records), default=0),
            "spill_bytes": sum(r["spill_stores"] + r["spill_loads"] for r in records),
            "carried": len(carried),
            "variants_failed": sum("error" in r for e in entries for r in e["carried"]),
        },
    }
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")
    return manifest


def _same(ra: dict | None, rb: dict | None, field: str) -> bool:
    return bool(ra and rb and ra.get(field) and ra.get(field) == rb.get(field))


def compare(ours: dict, theirs: dict) -> list[dict]:
    """Per key: changed / unchanged / new / gone against another manifest, with resource differences."""
    a = {e["key"]: e for e in theirs["keys"]}
    b = {e["key"]: e for e in ours["keys"]}
    rows = []
    for key in sorted(set(a) | set(b)):
        if key not in a:
            rows.append({"key": key, "status": "new", "diff": []})
            continue
        if key not in b:
            rows.append({"key": key, "status": "gone", "diff": []})
            continue
        ka = {r["role"]: r for r in a[key]["kernels"]}
        kb = {r["role"]: r for r in b[key]["kernels"]}
        codes = {r["hash"] for r in ka.values()} | {r["hash"] for r in kb.values()}
        both = {r["hash"] for r in ka.values()} & {r["hash"] for r in kb.values()}
        diff = []
        for role in sorted(set(ka) | set(kb)):
            ra, rb = ka.get(role), kb.get(role)
            one_sided_peer = (ra is None or rb is None) and role.startswith("peer")
            if one_sided_peer and (ra or rb)["hash"] in both and len(codes) == len(both):
                continue  # a peer's launch one side lists and the other does not (an older manifest), of a code
                # object both build; any other launch on one side only (a stage more or fewer) is a change
            if ra is None or rb is None or ra["hash"] != rb["hash"]:
                fields = ("registers", "spill_stores", "spill_loads", "shared", "stack")
                diff.append(
                    {
                        "role": role,
                        **{f: [ra.get(f) if ra else None, rb.get(f) if rb else None] for f in fields},
                        # the same PTX but for its functions' names (False: a side that did not record it)
                        "same_code": _same(ra, rb, "code"),
                        # the same machine code but for its functions' names
                        "same_sass": _same(ra, rb, "sass"),
                    }
                )
        if not diff:
            status = "unchanged"
        elif all(d["same_sass"] for d in diff):
            status = "renamed"  # names alone: the speed is REF's
        elif all(d["same_code"] for d in diff):
            status = "reallocated"  # REF's PTX, other machine code: ptxas's choices follow the names
        else:
            status = "changed"
        rows.append({"key": key, "status": status, "diff": diff})
    return rows
