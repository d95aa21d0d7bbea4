"""docs/knobs.md's tables, rendered from the registry (`kind_knobs`, `KINDS`), and the command that rewrites them.

The page's prose is written by hand; its tables are generated, each between two marker comments:
`<!-- knobs:begin shared -->` ... `<!-- knobs:end shared -->` (the knobs several kinds take), then one region per
kind (`<!-- knobs:begin dense -->` ...). Everything outside the regions is left as it is.

    python -m glm53ctl.knob_docs --write   # rewrite the tables from the registry
    python -m glm53ctl.knob_docs --check   # exit 1, with a diff, where they differ (what tests/configs/ checks)
    python -m glm53ctl.knob_docs           # print the tables

Which table a knob is in. A knob is its name, values, class and help (its default may differ per kind). It is
shared where two kinds take it of which neither takes every knob of the other's (the runtime's `grid`, `warps`,
...; `block_k`, which `tail` and `dense` declare alike). Otherwise the kinds that take it nest, and it is the
smallest one's own (`kda` takes every knob of `dense`'s and `sparse` every one of `kda`'s: `block_n_in` is
`dense`'s, and `kda`'s and `sparse`'s tables say they take `dense`'s knobs). Two knobs of one name that differ
(`tail`'s `norm` and `dense`'s) are two knobs.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from glm53ctl.kernels.kinds import KINDS
from glm53ctl.tuning.knobs import kind_knobs

DOC = Path(__file__).resolve().parent.parent / "docs" / "knobs.md"
COMMAND = "python -m glm53ctl.knob_docs --write"
SHARED = "shared"
# a marker is a line of its own (the page's prose may quote one)
_REGION = re.compile(r"^<!-- knobs:begin (\S+) -->\n(.*?)^<!-- knobs:end (\S+) -->$", re.DOTALL | re.MULTILINE)
_BEGIN = re.compile(r"^<!-- knobs:begin (\S+) -->$", re.MULTILINE)
_NOTE = f"<!-- generated from the registry by `{COMMAND}`: edit the knobs, not this table -->"


class KnobDocsError(Exception):
    """docs/knobs.md's markers do not match the registry's kinds (a region missing its end, a kind gone)."""


@dataclass
class _Entry:
    """One knob as the kinds that take it declare it: its defaults by kind, in registry order."""

    knob: object
    defaults: dict = field(default_factory=dict)


def registry() -> dict[str, dict]:
    """Every kind's knobs by name, in registry order (`kind_knobs`: the shared ones first, then its own)."""

    return {kind: kind_knobs(kind) for kind in KINDS}


def _ident(knob) -> tuple:
    return (knob.name, tuple(knob.values), knob.cls, knob.help)


def _value(v) -> str:
    return f"`{v}`" if isinstance(v, str) else str(v)


def _values(values) -> str:
    return ", ".join(map(_value, values))


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _kinds(kinds, every) -> str:
    """`kinds` in words: all, all but a few, or the list (registry order)."""
    kinds = [k for k in every if k in kinds]
    missing = [k for k in every if k not in kinds]
    if not missing:
        return "all"
    if len(missing) <= 2 and len(missing) < len(kinds):
        return "all but " + ", ".join(missing)
    return ", ".join(kinds)


def _defaults(defaults: dict) -> str:
    """One default, or the kinds grouped by the default each has (`embed, tail: 1; dense, kda, sparse: 0`)."""
    groups: dict = {}
    for kind, value in defaults.items():
        groups.setdefault(_value(value), []).append(kind)
    if len(groups) == 1:
        return next(iter(groups))
    return "; ".join(f"{', '.join(kinds)}: {value}" for value, kinds in groups.items())


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _classify(reg: dict[str, dict]) -> tuple[dict, dict]:
    """The knobs (by identity, first seen first) and each one's owner: the kind whose table has it, None: shared."""
    entries: dict[tuple, _Entry] = {}
    for kind, knobs in reg.items():
        for knob in knobs.values():
            entries.setdefault(_ident(knob), _Entry(knob)).defaults[kind] = knob.default
    taken = {kind: {_ident(k) for k in knobs.values()} for kind, knobs in reg.items()}
    owner = {}
    for ident, entry in entries.items():
        # its kinds in order of their knob sets; shared where two of them do not nest
        kinds = sorted(entry.defaults, key=lambda k: len(taken[k]))
        nested = all(taken[a] <= taken[b] for a, b in zip(kinds, kinds[1:], strict=False))
        owner[ident] = kinds[0] if nested else None
    return entries, owner


def _shared(entries: dict, owner: dict, every: list[str]) -> str:
    rows = [
        (
            f"`{e.knob.name}`",
            e.knob.cls,
            _values(e.knob.values),
            _defaults(e.defaults),
            _kinds(e.defaults, every),
            e.knob.help,
        )
        for ident, e in entries.items()
        if owner[ident] is None
    ]
    if not rows:
        return "No knob is taken by more than one kind."
    return _table(("knob", "class", "values", "default", "kinds", "what it does"), rows)


def _kind(kind: str, reg: dict, entries: dict, owner: dict) -> str:
    parts = []
    idents = [_ident(k) for k in reg[kind].values()]
    shared = [i for i in idents if owner[i] is None]
    if shared:
        taken = ", ".join(f"`{i[0]}={entries[i].defaults[kind]}`" for i in shared)
        parts.append(f"Shared knobs it takes, at its defaults: {taken}.")
    # the knobs of other kinds it takes (all of each such kind's), with the defaults that differ there
    others: dict[str, list] = {}
    for i in idents:
        if owner[i] not in (None, kind):
            others.setdefault(owner[i], []).append(i)
    same = [o for o, ids in others.items() if all(entries[i].defaults[kind] == entries[i].defaults[o] for i in ids)]
    if same:
        names = " and ".join(f"`{o}`" for o in same)
        parts.append(f"Every knob of {names}, with the same defaults.")
    for o, ids in others.items():
        if o in same:
            continue
        differ = [i for i in ids if entries[i].defaults[kind] != entries[i].defaults[o]]
        here = ", ".join(f"`{i[0]}={entries[i].defaults[kind]}`" for i in differ)
        there = ", ".join(f"`{i[0]}={entries[i].defaults[o]}`" for i in differ)
        parts.append(f"Every knob of `{o}`, with the same defaults but {here} (`{o}`: {there}).")
    own = [entries[i].knob for i in idents if owner[i] == kind]
    if own:
        rows = [(f"`{k.name}`", k.cls, _values(k.values), _value(k.default), k.help) for k in own]
        table = _table(("knob", "class", "values", "default", "what it does"), rows)
        parts.append(("Its own:\n\n" if len(parts) else "") + table)
    else:
        parts.append("No knobs of its own.")
    return "\n\n".join(parts)


def render(reg: dict[str, dict] | None = None) -> dict[str, str]:
    """Each region's markdown by name: `shared`, then one per kind in registry order."""
    reg = registry() if reg is None else reg
    entries, owner = _classify(reg)
    out = {SHARED: _shared(entries, owner, list(reg))}
    for kind in reg:
        out[kind] = _kind(kind, reg, entries, owner)
    return out


def _region(name: str, body: str) -> str:
    return f"<!-- knobs:begin {name} -->\n{_NOTE}\n\n{body}\n\n<!-- knobs:end {name} -->"


def regenerate(text: str, regions: dict[str, str] | None = None) -> str:
    """`text` (docs/knobs.md) with every region rewritten from `regions` (default: the registry's). A kind with no
    region yet gets a section of its own after the last kind's; a region the registry has no table for is an
    error (remove its section by hand)."""
    regions = render() if regions is None else regions
    found = [m.group(1) for m in _REGION.finditer(text)]
    for m in _REGION.finditer(text):
        if m.group(1) != m.group(3):
            raise KnobDocsError(f"`knobs:begin {m.group(1)}` is closed by `knobs:end {m.group(3)}`")
    for begin in _BEGIN.findall(text):
        if begin not in found:
            raise KnobDocsError(f"`knobs:begin {begin}` has no `<!-- knobs:end {begin} -->`")
    if dupes := sorted({n for n in found if found.count(n) > 1}):
        raise KnobDocsError(f"more than one region for {', '.join(dupes)}")
    if stale := [n for n in found if n not in regions]:
        raise KnobDocsError(
            f"docs/knobs.md has a table for {', '.join(stale)}, which the registry does not list: remove its section"
        )
    if SHARED not in found:
        raise KnobDocsError(f"no `<!-- knobs:begin {SHARED} -->` ... `<!-- knobs:end {SHARED} -->` region")
    text = _REGION.sub(lambda m: _region(m.group(1), regions[m.group(1)]), text)
    missing = [n for n in regions if n not in found]
    if missing:
        last = [m for m in _REGION.finditer(text) if m.group(1) != SHARED] or list(_REGION.finditer(text))
        at = last[-1].end()
        added = "".join(f"\n\n## `{n}`\n\n{_region(n, regions[n])}" for n in missing)
        text = text[:at] + added + text[at:]
    return text


def diff(text: str, path: Path | str = DOC) -> str:
    """The unified diff from `text` to what the registry renders now ("" where they agree)."""
    new = regenerate(text)
    lines = difflib.unified_diff(
        text.splitlines(keepends=True), new.splitlines(keepends=True), f"{path}", f"{path} (from the registry)"
    )
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m glm53ctl.knob_docs", description="docs/knobs.md's tables, generated from the kind registry"
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite the tables in the file (the prose is kept)")
    group.add_argument("--check", action="store_true", help="exit 1, with a diff, where the tables have drifted")
    parser.add_argument("--path", type=Path, default=DOC, help=f"the page (default: {DOC})")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        for name, body in render().items():
            print(f"{_region(name, body)}\n")
        return 0
    try:
        text = args.path.read_text()
        if args.check:
            if d := diff(text, args.path):
                sys.stdout.write(d)
                print(f"{args.path}: the knob tables differ from the registry; run `{COMMAND}`", file=sys.stderr)
                return 1
            return 0
        new = regenerate(text)
    except (OSError, KnobDocsError) as e:
        print(f"{args.path}: {e}", file=sys.stderr)
        return 2
    if new != text:
        args.path.write_text(new)
        print(f"{args.path}: tables rewritten from the registry", file=sys.stderr)
    else:
        print(f"{args.path}: tables up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
