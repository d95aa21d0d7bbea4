"""Tuned-config files, configs/tuned/<model>/tp<T>.json (docs/design.md §6).

The schema is validated at the file boundary (pydantic, unknown keys forbidden); older files migrate
one version at a time; a newer file is refused; writes are atomic.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from glm53ctl.errors import ConfigError, Glm53Error
from glm53ctl.files import write_atomic as write
from glm53ctl.kernels.kinds import KINDS, get_kind
from glm53ctl.kernels.spec import format_validation_error, load_model
from glm53ctl.paths import read_text

SCHEMA_VERSION = 2


def _kind(v: str) -> str:

    if v not in KINDS:
        raise ValueError(f"Input should be one of {', '.join(map(repr, KINDS))}")
    return v


Kind = Annotated[str, AfterValidator(_kind)]


def _knob_value(v: object) -> object:
    if not isinstance(v, bool | int | str):
        raise ValueError("expected a bool, int or str")
    return v


KnobValue = Annotated[bool | int | str, BeforeValidator(_knob_value)]
Rows = Annotated[int, Field(ge=1, le=8)]


def _v1_to_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 2 records the context an entry was tuned at (`Entry.context`); a version-1 entry has none: it
    reads as tuned at the check's contexts, as a tune without --context is."""
    return doc


# schema_version N -> function turning a version-N document into a version-(N+1) one (each bump adds one here
# and a CHANGELOG "Changed" entry).
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Provenance(_Strict):
    """Where the numbers were measured; a mismatch with this machine is warned about on lookup."""

    glm53ctl: str
    git_sha: str
    git_dirty: bool
    gpu_name: str
    gpu_capability: str = Field(pattern=r"^\d+\.\d+$")
    driver: str
    cuda: str
    torch: str
    triton: str
    date: str  # ISO 8601
    command: str  # the exact `glm53ctl tune ...` that wrote the entry
    study: str | None = None
    seed: int | None = None


class Evidence(_Strict):
    default_us: float = Field(gt=0)
    chosen_us: float = Field(gt=0)
    ratio: float = Field(gt=0)  # chosen / default, median of alternating rounds
    ratio_ci: tuple[float, float]  # bootstrap confidence interval of the ratio
    delta: float = Field(ge=0)  # the keep threshold in force: kept only if ratio_ci[1] < 1 - delta
    samples: int = Field(ge=1)

    @field_validator("ratio_ci")
    @classmethod
    def _ordered(cls, ci: tuple[float, float]) -> tuple[float, float]:
        if not 0 < ci[0] <= ci[1]:
            raise ValueError("expected [low, high] with 0 < low <= high")
        return ci


class DroppedKnob(_Strict):
    knob: str
    value: KnobValue
    reason: str  # e.g. "1.8% slower at TP2"


class Entry(_Strict):
    """The knobs kept for one (kind, rows), why, and what was dropped; for a kind that reads caches, the context
    (tokens) it was tuned at (None: the check's contexts, rows below and above the selection width)."""

    knobs: dict[str, KnobValue] = {}
    context: int | None = Field(default=None, ge=0)
    evidence: Evidence | None = None
    dropped: list[DroppedKnob] = []


class TunedConfig(_Strict):
    schema_version: Literal[2]
    model: str
    tp: int

    @field_validator("tp")
    @classmethod
    def _width(cls, tp: int) -> int:
        if tp not in (1, 2, 4, 8):
            raise ValueError("expected one of 1, 2, 4, 8")
        return tp

    revision: int = Field(ge=1)
    provenance: Provenance
    # kind -> rows -> entry
    entries: dict[Kind, dict[Rows, Entry]] = {}

    def entry(self, kind: str, rows: int) -> Entry | None:
        return self.entries.get(kind, {}).get(rows)  # type: ignore[call-overload]


def _render(path: Path, err: ValidationError) -> str:

    return format_validation_error(path, err)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise ValueError(f"duplicate key {dup!r}")
    return dict(pairs)


def read_document(path: Path) -> dict[str, Any]:

    return read_document_text(path, read_text(path))


def read_document_text(path: Path, text: str) -> dict[str, Any]:
    """A tuned file's JSON text as a document (errors name `path`)."""
    try:
        doc = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: (top level): expected a JSON object, found {type(doc).__name__}")
    return doc


def schema_version_of(path: Path, doc: dict[str, Any]) -> int:
    if "schema_version" not in doc:
        raise ConfigError(
            f"{path}: schema_version: missing (every tuned file names its schema; this glm53ctl reads 1 to "
            f"{SCHEMA_VERSION})",
            hint=f'add "schema_version": {SCHEMA_VERSION} if the file follows the current schema (docs/design.md §6)',
        )
    v = doc["schema_version"]
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"{path}: schema_version: expected a positive integer, found {v!r}")
    if v > SCHEMA_VERSION:
        raise ConfigError(
            f"{path}: schema_version {v} is newer than this glm53ctl reads (up to {SCHEMA_VERSION})",
            hint="a newer glm53ctl wrote it: upgrade glm53ctl (`git pull` in its checkout, or `pip install -U`)",
        )
    return v


def migrate_document(path: Path, doc: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The document at SCHEMA_VERSION and the version it started at."""
    start = version = schema_version_of(path, doc)
    while version < SCHEMA_VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise ConfigError(f"{path}: no migration from schema_version {version}")
        try:
            doc = step(dict(doc))
        except KeyError as e:
            raise ConfigError(f"{path}: migrating from schema_version {version}: missing key {e}") from None
        version += 1
        doc["schema_version"] = version
    return doc, start


def load(path: Path) -> TunedConfig:
    doc, _ = migrate_document(path, read_document(path))
    return load_document(path, doc)


def load_document(path: Path, doc: dict[str, Any]) -> TunedConfig:
    """Validate a current-version document read from `path` (named in every error)."""
    try:
        # strict, in JSON mode: "2" is not an integer and 2.0 is not a TP width
        cfg = TunedConfig.model_validate_json(json.dumps(doc), strict=True)
    except ValidationError as e:
        raise ConfigError(_render(path, e), hint="`glm53ctl configs validate` checks every file") from None
    _check_location(path, cfg)
    _check_knobs(path, cfg)
    return cfg


def _check_knobs(path: Path, cfg: TunedConfig) -> None:
    """The model is one glm53ctl knows and every knob kept or dropped is one of its kind's, at one of its values
    (the knob registry): a file naming another is refused here, naming the file and the key path, not later."""

    try:
        load_model(cfg.model)
    except Glm53Error as e:
        raise ConfigError(f"{path}: model: {e.message}", hint=e.hint) from None
    for kind, per_rows in cfg.entries.items():
        known = get_kind(kind).all_knobs()
        for rows, entry in per_rows.items():
            where = f"{path}: entries.{kind}.{rows}"
            if entry.context is not None and not get_kind(kind).reads_context:
                raise ConfigError(f"{where}.context: {kind} reads no caches, so it is tuned at no context (null)")
            pairs = [(f"knobs.{k}", k, v) for k, v in entry.knobs.items()]
            pairs += [(f"dropped.{i}", d.knob, d.value) for i, d in enumerate(entry.dropped)]
            for at, name, value in pairs:
                knob = known.get(name)
                if knob is None:
                    expect = ", ".join(known) or "none yet"
                    raise ConfigError(f"{where}.{at}: {name!r} is not a knob of {kind} (its knobs: {expect})")
                if not _is_value(knob, value):
                    expect = (
                        "a program count of 1 or more, or 0 (per device)"
                        if name == "grid"
                        else (f"one of {', '.join(map(str, knob.values))}")
                    )
                    raise ConfigError(f"{where}.{at}: {value!r} is not a value of {name} (expected {expect})")


def _is_value(knob, value) -> bool:
    """One of the knob's values, and of its type (True is not the 1 of an int knob); grid any count >= 0."""
    if knob.name == "grid":
        return type(value) is int and value >= 0
    return any(type(value) is type(v) and value == v for v in knob.values)


def _check_location(path: Path, cfg: TunedConfig) -> None:
    """configs/tuned/<model>/tp<T>.json: the name is the lookup key, so it must agree with the body."""
    if path.parent.parent.name == "tuned":
        if path.name != f"tp{cfg.tp}.json":
            raise ConfigError(f"{path}: tp: {cfg.tp} does not match the file name {path.name!r}")
        if path.parent.name != cfg.model:
            raise ConfigError(f"{path}: model: {cfg.model!r} does not match the folder {path.parent.name!r}")


def dump(cfg: TunedConfig) -> str:
    doc = cfg.model_dump(mode="json")
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """The text, fsynced, written atomically (glm53ctl.files)."""

    write(path, text)


def save(path: Path, cfg: TunedConfig) -> None:
    write_atomic(path, dump(cfg))


def tuned_files(root: Path) -> list[Path]:
    return sorted((root / "tuned").glob("*/tp*.json"))


def lookup(
    cfg: TunedConfig | None,
    kind: str,
    rows: int,
    defaults: dict[str, KnobValue],
    gpu_capability: str | None = None,
    triton_version: str | None = None,
) -> tuple[dict[str, KnobValue], str, list[str]]:
    """The knobs in force for (kind, rows): tuned entry over the defaults, its source, and warnings.

    An entry measured on another GPU capability or another Triton minor version is still used, with a warning
    (docs/design.md §6); one tuned at another context: `context_warnings`.
    """
    entry = cfg.entry(kind, rows) if cfg else None
    if cfg is None or entry is None:
        return dict(defaults), "defaults", []
    warnings = []
    p = cfg.provenance
    if gpu_capability and p.gpu_capability != gpu_capability:
        warnings.append(f"tuned on capability {p.gpu_capability}, this GPU is {gpu_capability}")
    if triton_version and _minor(p.triton) != _minor(triton_version):
        warnings.append(f"tuned with Triton {p.triton}, this is Triton {triton_version}")
    if warnings:
        warnings.append(f"re-run `glm53ctl tune --tp {cfg.tp} --rows {rows} --kind {kind}`")
    return {**defaults, **entry.knobs}, f"tuned r{cfg.revision}", warnings


def context_warnings(cfg: TunedConfig | None, kind: str, rows: int, context: int | None) -> list[str]:
    """For a key of a kind that reads caches, run at `context` (None: the check's contexts): what to say when
    its entry was tuned at another context (the entry is used all the same)."""
    entry = cfg.entry(kind, rows) if cfg else None
    if entry is None or entry.context == context:
        return []
    at = lambda c: "the check's contexts" if c is None else f"context {c}"  # noqa: E731
    again = f"glm53ctl tune --tp {cfg.tp} --rows {rows} --kind {kind}" + (
        f" --context {context}" if context is not None else ""
    )
    return [f"tuned at {at(entry.context)}, this key runs at {at(context)}", f"re-run `{again}`"]


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])
