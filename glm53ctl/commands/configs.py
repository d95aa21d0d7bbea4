"""`glm53ctl configs show | validate | diff | migrate`: the model and tuned-config files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from glm53ctl import tuned
from glm53ctl.commands import Command
from glm53ctl.errors import ConfigError, Glm53Error, UsageError
from glm53ctl.files import check_replaceable
from glm53ctl.kernels.kinds import kernel_kinds
from glm53ctl.kernels.kinds.fits import runnable
from glm53ctl.kernels.spec import TP_WIDTHS, load_model, load_model_file, model_files
from glm53ctl.output import Output, plural, print_error
from glm53ctl.paths import config_root

app = typer.Typer(
    name="configs",
    help="Show, validate, diff and migrate the model and tuned-config files.",
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


def _model_row(spec) -> dict:

    kda = sum(1 for a, _ in spec.layers if a == "kda")
    tps = []
    for tp in TP_WIDTHS:
        try:
            spec.check_tp(tp)
            tps.append(tp)
        except Glm53Error:
            pass
    return {
        "name": spec.name,
        "hidden": spec.hidden,
        "layers": spec.model.num_layers,
        "kda_layers": kda,
        "dsa_layers": spec.model.num_layers - kda,
        "vocab": spec.model.vocab_size,
        "experts": spec.moe.experts,
        "top_k": spec.moe.top_k,
        "tp": tps,
        "description": spec.description,
    }


def _shard_rows(spec, tp: int) -> list[dict]:
    shards = spec.shards(tp)
    return [
        {"part": part, "tensor": name, "shape": list(shape)}
        for part, tensors in shards.weight_shapes().items()
        for name, shape in tensors.items()
    ]


@app.command(cls=Command)
def show(
    model: Annotated[str | None, typer.Option("--model", "-m", help="One model: its dims and shards.")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="TP width for --model's per-rank shapes.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The models, the tuned files, and with --model a model's per-rank shard shapes."""

    out = Output(as_json)
    root = config_root()
    if model is None and tp is not None:
        raise UsageError("--tp needs --model", hint="glm53ctl configs show --model tiny --tp 4")
    if model is not None:
        tp = 1 if tp is None else tp
        spec = load_model(model)
        shards = _shard_rows(spec, tp)
        entries = _tuned_entries(root, spec.name, tp)
        out.json({"model": spec.model_dump(), "tp": tp, "shards": shards, "tuned": entries})
        out.table(f"{spec.name} — {spec.description}", ["section", "dims"], _dims_rows(spec))
        out.table(
            f"{spec.name} per-rank shapes at TP{tp}",
            ["part", "tensor", "shape"],
            [(r["part"], r["tensor"], "×".join(map(str, r["shape"]))) for r in shards],
        )
        out.table(
            f"tuned knobs at TP{tp}",
            ["kind", "rows", "knobs", "evidence"],
            [(e["kind"], e["rows"], e["knobs"], e["evidence"]) for e in entries],
        )
        if not entries:
            out.text(f"no tuned entries for {spec.name} at TP{tp}: every kind runs its defaults")
        return
    models, files, errors = [], [], []
    for path in model_files().values():
        try:
            models.append(_model_row(load_model_file(path)))
        except ConfigError as e:
            errors.append(e)
    for path in tuned.tuned_files(root):
        try:
            files.append(_tuned_summary(path))
        except ConfigError as e:
            errors.append(e)
    for e in errors:
        print_error(e.message, e.hint)  # with its hint: a newer file says to upgrade glm53ctl
    out.json({"config_root": str(root), "models": models, "tuned": files, "errors": [e.message for e in errors]})
    out.text(f"config root: {root}")
    out.table(
        "models",
        ["model", "hidden", "layers (KDA+DSA)", "vocab", "MoE", "TP widths"],
        [
            (
                m["name"],
                m["hidden"],
                f"{m['layers']} ({m['kda_layers']}+{m['dsa_layers']})",
                m["vocab"],
                f"{m['experts']} top-{m['top_k']} +1",
                ",".join(map(str, m["tp"])),
            )
            for m in models
        ],
    )
    out.table(
        "tuned configs",
        ["file", "model", "TP", "schema", "revision", "entries", "GPU", "date"],
        [
            (f["file"], f["model"], f["tp"], f["schema_version"], f["revision"], f["entries"], f["gpu"], f["date"])
            for f in files
        ],
    )
    if not files and not errors:
        out.text("no tuned configs yet: every kernel runs its defaults (`glm53ctl tune --write` adds them)")
    if errors:
        raise typer.Exit(2)


def _dims_rows(spec) -> list[tuple[str, str]]:
    d = spec.model_dump()
    return [
        (section, ", ".join(f"{k}={v}" for k, v in vals.items()))
        for section, vals in d.items()
        if isinstance(vals, dict)
    ]


def _tuned_summary(path: Path) -> dict:
    doc, start = tuned.migrate_document(path, tuned.read_document(path))
    cfg = tuned.load_document(path, doc)
    return {
        "file": str(path),
        "model": cfg.model,
        "tp": cfg.tp,
        "schema_version": start,  # the file's own, not the one it reads as
        "revision": cfg.revision,
        "entries": sum(len(v) for v in cfg.entries.values()),
        "gpu": cfg.provenance.gpu_name,
        "date": cfg.provenance.date,
    }


def _tuned_entries(root: Path, model: str, tp: int) -> list[dict]:
    path = root / "tuned" / model / f"tp{tp}.json"
    if not path.exists():
        return []
    cfg = tuned.load(path)
    rows = []
    for kind, per_rows in sorted(cfg.entries.items()):
        for r, e in sorted(per_rows.items()):
            ev = e.evidence
            rows.append(
                {
                    "kind": kind,
                    "rows": r,
                    "knobs": ", ".join(f"{k}={v}" for k, v in sorted(e.knobs.items())) or "(defaults)",
                    "evidence": f"{ev.default_us:.1f} → {ev.chosen_us:.1f} µs" if ev else "",
                }
            )
    return rows


def _all_files(root: Path) -> list[Path]:

    return list(model_files().values()) + tuned.tuned_files(root)


def _validate_one(path: Path) -> int | None:
    """Raise on an invalid file; a tuned file's schema_version (as written: an older one reads migrated)."""

    if path.suffix == ".toml":
        load_model_file(path)
        return None
    if path.suffix == ".json":
        doc, start = tuned.migrate_document(path, tuned.read_document(path))
        tuned.load_document(path, doc)
        return start
    raise ConfigError(f"{path}: not a config file (expected .toml or .json)")


def _kernels_of(path: Path) -> dict:
    """A valid model file: per kind with kernels, the TP widths its kernels run it at, and for each width they do
    not, the first rule it breaks (kinds/dims.py)."""

    spec = load_model_file(path)
    out = {}
    for kind, per_tp in runnable(spec, [*kernel_kinds(), "model"], TP_WIDTHS).items():
        out[kind] = {
            "tp": [t for t, bad in per_tp.items() if not bad],
            "not": {t: str(bad[0]) for t, bad in per_tp.items() if bad},
        }
    return out


def _kernels_said(kernels: dict) -> str:
    """'the kernels of every kind run it at TP 1/2/4/8', or per kind where they differ."""
    widths = {k: f"TP {'/'.join(map(str, v['tp']))}" if v["tp"] else "no TP width" for k, v in kernels.items()}
    if len(set(widths.values())) == 1:
        return f"the kernels of every kind run it at {next(iter(widths.values()))}"
    return "the kernels run it: " + ", ".join(f"{k} at {w}" for k, w in widths.items())


def _why_not(kernels: dict) -> list[str]:
    """Per kind, each rule its kernels break, with the widths where it does: one line each."""
    lines = []
    for kind, k in kernels.items():
        by_why: dict[str, list[int]] = {}
        for t, why in k["not"].items():
            by_why.setdefault(why, []).append(t)
        lines += [f"{kind} at TP {'/'.join(map(str, ts))}: {why}" for why, ts in by_why.items()]
    return lines


def _older(schema: int | None) -> bool:
    """A tuned file at an older schema: it reads (migrated in memory), and `configs migrate` rewrites it."""
    return schema is not None and schema < tuned.SCHEMA_VERSION


@app.command(cls=Command)
def validate(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="Files to check (default: every shipped file).", metavar="FILE")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check model (.toml) and tuned (.json) files against their schema; exit 2 on any error."""
    out = Output(as_json)
    files = list(paths) if paths else _all_files(config_root())
    results = []
    for p in files:
        try:
            schema = _validate_one(p)
            kernels = _kernels_of(p) if p.suffix == ".toml" else None
            said = f"ok, schema v{schema}: wants migrating" if _older(schema) else "ok"
            results.append(
                {
                    "file": str(p),
                    "ok": True,
                    "error": None,
                    "schema_version": schema,
                    "result": said + (f"; {_kernels_said(kernels)}" if kernels else ""),
                    **({"kernels": kernels} if kernels else {}),
                }
            )
        except ConfigError as e:
            results.append(
                {"file": str(p), "ok": False, "error": e.message, "schema_version": None, "result": "INVALID"}
            )
            print_error(e.message, e.hint)
    out.json({"files": results, "ok": all(r["ok"] for r in results)})
    out.table("validate", ["file", "result"], [(r["file"], r["result"]) for r in results])
    older = [r for r in results if _older(r["schema_version"])]
    for r in older:  # one greppable line each, the command to run in it
        out.text(
            f"{r['file']}: schema v{r['schema_version']}: `glm53ctl configs migrate {r['file']}` brings it to "
            f"v{tuned.SCHEMA_VERSION}"
        )
    for r in results:  # a model file the kernels cannot run everywhere: why, per kind and width, one line each
        for line in _why_not(r.get("kernels") or {}):
            out.text(f"{r['file']}: {line}")
    if any(not r["ok"] for r in results):
        raise typer.Exit(2)
    out.text(
        f"{len(results)} of {plural(len(results), 'files')} valid"
        + (f"; {len(older)} at an older schema" if older else "")
    )


@app.command(cls=Command)
def diff(
    a: Annotated[Path, typer.Argument(help="Tuned file A.", metavar="A.json")],
    b: Annotated[Path, typer.Argument(help="Tuned file B.", metavar="B.json")],
    as_json: JsonOpt = False,
) -> None:
    """Knob by knob, what differs between two tuned files (and their provenance)."""
    out = Output(as_json)
    for path in (a, b):
        if path.suffix == ".toml":  # a model file: diff compares tuned files, not "not valid JSON" (issue 45)
            raise UsageError(
                f"{path}: a model file; configs diff compares two tuned files (configs/tuned/<model>/tp<T>.json)",
                hint="`glm53ctl configs show --model M` shows a model's dims",
            )
    ca, cb = tuned.load(a), tuned.load(b)
    changes = []
    for field in ("model", "tp", "revision"):
        if getattr(ca, field) != getattr(cb, field):
            changes.append({"where": field, "knob": "", "a": getattr(ca, field), "b": getattr(cb, field)})
    pa, pb = ca.provenance.model_dump(), cb.provenance.model_dump()
    for k in sorted(pa):
        if pa[k] != pb[k]:
            changes.append({"where": "provenance", "knob": k, "a": pa[k], "b": pb[k]})
    keys = sorted({(k, r) for c in (ca, cb) for k, rs in c.entries.items() for r in rs})
    for kind, rows in keys:
        ea, eb = ca.entry(kind, rows), cb.entry(kind, rows)
        ka = ea.knobs if ea else {}
        kb = eb.knobs if eb else {}
        where = f"{kind} rows={rows}"
        if ea is None or eb is None:
            changes.append(
                {
                    "where": where,
                    "knob": "(entry)",
                    "a": "present" if ea else "absent",
                    "b": "present" if eb else "absent",
                }
            )
        for knob in sorted(set(ka) | set(kb)):
            if ka.get(knob) != kb.get(knob):
                changes.append({"where": where, "knob": knob, "a": ka.get(knob), "b": kb.get(knob)})
        if ea is not None and eb is not None:
            if ea.context != eb.context:  # tuned at another context (a kind that reads caches)
                changes.append({"where": where, "knob": "context", "a": ea.context, "b": eb.context})
            va = ea.evidence.model_dump() if ea.evidence else {}
            vb = eb.evidence.model_dump() if eb.evidence else {}
            for k in sorted(set(va) | set(vb)):
                if va.get(k) != vb.get(k):
                    changes.append({"where": where, "knob": f"evidence.{k}", "a": va.get(k), "b": vb.get(k)})
            da, db = _dropped(ea), _dropped(eb)
            if da != db:  # only the drops that differ (the rest are in both), each on a line of its own
                changes.append({"where": where, "knob": "dropped", "a": sorted(da - db), "b": sorted(db - da)})
    out.json({"a": str(a), "b": str(b), "changes": changes, "equal": not changes})
    if not changes:
        out.text(f"{a} and {b} are equal")
        return
    # 100 columns at most, on a terminal or in a file: long cells (a tune command, a drop's reason) fold
    out.table(
        f"{a} → {b}",
        ["where", "knob", "A", "B"],
        [
            (c["where"], c["knob"], *(_drops(c[s]) if c["knob"] == "dropped" else _cell(c[s]) for s in "ab"))
            for c in changes
        ],
        width=100,
    )


def _drops(drops: list[str]) -> str:
    """One drop a line, each marked where it starts (a long reason folds)."""
    return "\n".join(f"- {d}" for d in drops) or "—"


def _dropped(entry) -> set[str]:
    """A drop as `knob=value: reason`, the knob named once (`tune` writes reasons that start with it)."""
    out = set()
    for d in entry.dropped:
        head = f"{d.knob}={d.value}"
        out.add(d.reason if d.reason.startswith(head) else f"{head}: {d.reason}")
    return out


def _cell(v) -> str:
    """A diff cell as a person reads it: 1.03, not 1.0300000000000002; a pair as `a, b`; none as —."""
    if v is None or v == "":
        return "—"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, tuple | list):
        return ", ".join(_cell(x) for x in v)
    return str(v)


@app.command(cls=Command)
def migrate(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="Tuned files (default: every shipped one).", metavar="FILE")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would change; write nothing.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Bring tuned files to the current schema_version, one step at a time, rewriting them atomically."""
    out = Output(as_json)
    files = list(paths) if paths else tuned.tuned_files(config_root())
    results = []
    failed = 0
    for p in files:
        try:
            doc, start = tuned.migrate_document(p, tuned.read_document(p))
            cfg = tuned.load_document(p, doc)
            if start != tuned.SCHEMA_VERSION:  # a read-only file or folder is refused, --dry-run too: never replaced
                check_replaceable(
                    "", p, hint="make it and its folder writable to migrate it in place, or migrate a copy"
                )
            if start != tuned.SCHEMA_VERSION and not dry_run:
                try:
                    tuned.save(p, cfg)
                except OSError as e:  # what the check cannot foresee (a full disk); the old file stays whole
                    raise ConfigError(f"{p}: cannot write the migrated file ({e.strerror})") from None
        except Glm53Error as e:
            print_error(e.message, e.hint)
            results.append({"file": str(p), "from": None, "to": tuned.SCHEMA_VERSION, "status": "error"})
            failed += 1
            continue
        if start == tuned.SCHEMA_VERSION:
            status = f"current (schema_version {start})"
        elif dry_run:
            status = f"would migrate schema_version {start} → {tuned.SCHEMA_VERSION}"
        else:
            status = f"migrated schema_version {start} → {tuned.SCHEMA_VERSION}"
        results.append({"file": str(p), "from": start, "to": tuned.SCHEMA_VERSION, "status": status})
    out.json({"files": results, "schema_version": tuned.SCHEMA_VERSION})
    for r in results:
        out.text(f"{r['file']}: {r['status']}")
    if not files:
        out.text(
            f"no tuned files under {config_root() / 'tuned'}: nothing to migrate "
            f"(this glm53ctl reads schema_version {tuned.SCHEMA_VERSION})"
        )
    if failed:
        raise typer.Exit(2)
