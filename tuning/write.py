"""`tune --write`: a tune's decisions into configs/tuned/<model>/tp<T>.json (docs/design.md §6) and a line in the
CHANGELOG. The file is validated as every load validates it, then replaced atomically, its revision one higher."""

from __future__ import annotations

import os
from pathlib import Path

from glm53ctl import tuned
from glm53ctl.paths import ENV_CONFIG_DIR, checkout_root, config_root, tuned_path


def entry_of(result: dict, old: tuned.Entry | None = None) -> tuned.Entry:
    """A tune result as the file's entry for (kind, rows): the knobs kept (only those that differ from the
    defaults), the evidence of the kept set, and every knob dropped with its reason. A search of part of the
    space (`result["space"]`) held the key's tuned knobs outside it (`result["base"]`): those stay, and so do the
    old entry's evidence (where this search kept nothing) and its reasons for the knobs outside the space."""
    space, base = result.get("space"), dict(result.get("base") or {})
    dropped = [tuned.DroppedKnob(knob=d["knob"], value=d["value"], reason=d["reason"]) for d in result["decisions"]]
    dropped = [d for d in dropped if d.knob not in result["kept"]]
    if old is not None:
        dropped = [d for d in old.dropped if space is not None and d.knob not in space] + dropped
    evidence = tuned.Evidence(**result["evidence"]) if result["evidence"] else None
    if evidence is None and base and old is not None:
        evidence = old.evidence  # the held knobs' own measurement stands
    knobs = base | dict(result["kept"])
    return tuned.Entry(knobs=knobs, context=result.get("context"), evidence=evidence, dropped=dropped)


def write_results(model: str, results: list[dict], env: dict, root: Path | None = None) -> tuple[list[Path], list[str]]:
    """Each TP width's file updated with its keys' entries; returns the files written and what to warn of (the
    command prints it). A line goes into the checkout's CHANGELOG where the files are the checkout's own (`root`
    None: the config root in force is not $GLM53CTL_CONFIG_DIR's)."""
    written, warnings = [], []
    for tp in sorted({r["tp"] for r in results}):
        path = tuned_path(model, tp, root or config_root())
        old = tuned.load(path) if path.exists() else None
        entries = {k: dict(v) for k, v in old.entries.items()} if old else {}
        for r in (r for r in results if r["tp"] == tp):
            kind = entries.setdefault(r["kind"], {})
            kind[r["rows"]] = entry_of(r, kind.get(r["rows"]))
        cfg = tuned.TunedConfig(
            schema_version=tuned.SCHEMA_VERSION,
            model=model,
            tp=tp,
            revision=(old.revision + 1) if old else 1,
            provenance=tuned.Provenance(**env),
            entries=entries,
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        text = tuned.dump(cfg)
        tuned.load_document(path, tuned.read_document_text(path, text))  # what a later load will say
        tuned.write_atomic(path, text)
        written.append(path)
        if root is None and not os.environ.get(ENV_CONFIG_DIR):
            warnings += _changelog(path, cfg, [r for r in results if r["tp"] == tp])
    return written, warnings


def changelog_line(path: Path, cfg: tuned.TunedConfig, results: list[dict]) -> str:
    parts = []
    for r in results:
        kept = ", ".join(f"{n}={v}" for n, v in r["kept"].items())
        held = ", ".join(f"{n}={v}" for n, v in (r.get("base") or {}).items())
        e = r["evidence"]
        against = f"the µs with {held} alone" if held else "the default's µs"
        said = f"keeps {kept} ({e['ratio']:.3f}× {against})" if kept else "keeps the defaults"
        if held:
            said += f", holding {held}" if kept else f" beside {held}"
        at = "" if r.get("context") is None else f" at context {r['context']}"
        parts.append(f"{r['kind']} rows {r['rows']}{at} {said}")
    rel = f"configs/tuned/{cfg.model}/{path.name}"
    return f"- Tuned `{rel}` (revision {cfg.revision}, `{cfg.provenance.command}`): " + "; ".join(parts) + "."


def _changelog(path: Path, cfg: tuned.TunedConfig, results: list[dict]) -> list[str]:
    """The tune's line into the checkout's CHANGELOG; what to warn of where there is none."""
    root = checkout_root()
    if root is None or not (root / "CHANGELOG.md").exists():
        return ["no CHANGELOG.md beside this glm53ctl (not a checkout): the tune's line is not recorded"]
    add_changelog_line(root / "CHANGELOG.md", changelog_line(path, cfg, results))
    return []


def add_changelog_line(changelog: Path, line: str, section: str = "Changed") -> None:
    """`line` first under `### <section>` of `## [Unreleased]` (both made where missing)."""
    lines = changelog.read_text().splitlines()
    try:
        top = next(i for i, x in enumerate(lines) if x.startswith("## [Unreleased]"))
    except StopIteration:
        first = next((i for i, x in enumerate(lines) if x.startswith("## ")), len(lines))
        lines[first:first] = ["## [Unreleased]", ""]
        top = first
    end = next((i for i in range(top + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    head = next((i for i in range(top + 1, end) if lines[i].strip() == f"### {section}"), None)
    if head is None:
        lines[end:end] = [f"### {section}", "", line, ""]
    else:
        lines[head + 2 : head + 2] = [line]
    tuned.write_atomic(changelog, "\n".join(lines) + "\n")
