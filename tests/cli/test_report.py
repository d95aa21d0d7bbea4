"""`glm53ctl report --against REF`: the parts' own commands over one set of keys, written as report.md and
report.json (validated against the schema this folder holds: report.schema.json), and with --html one page."""

import json
import re
from pathlib import Path

import jsonschema
import pytest

from glm53ctl.commands.report import markdown, page, summary
from glm53ctl.worktree import run_cli
from tests.cli.conftest import edit

SCHEMA = json.loads((Path(__file__).parent / "report.schema.json").read_text())


def _report(repo, tmp_path, *args):
    out = tmp_path / "report"
    p = run_cli(repo, ["report", *args, "--out", str(out), "--worktrees", str(tmp_path / "cache")], capture_stderr=True)
    doc = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    md = (out / "report.md").read_text() if (out / "report.md").exists() else ""
    return p, doc, md


@pytest.mark.slow
@pytest.mark.interpreter
def test_a_schedule_change_reports_equal_bits_and_which_builds_change(repo, tmp_path):
    """HEAD changes a schedule knob's default (the polls' kind, a constexpr of every kernel of embed and tail):
    every output bit for bit as HEAD~1, every build changed and named; the timing said skipped on a CPU; both
    files written; exit 0."""
    old = '"poll",\n            (0, 1, 2),\n            1,'
    edit(repo, "kernels/kinds/base.py", old, old[: -len("1,")] + "2,")
    p, doc, md = _report(repo, tmp_path, "--against", "HEAD~1", "--kind", "embed,tail", "--tp", "1,2", "--rows", "1")
    assert p.returncode == 0, p.stderr[-3000:]
    jsonschema.validate(doc, SCHEMA)
    first = next(line for line in md.splitlines() if line.startswith("**"))
    assert first.startswith("**4 of 4 configs bitwise equal to HEAD~1; 4 of 4 configs pass; ")
    changed = doc["parts"]["build"]["doc"]["keys"]
    assert [r["key"] for r in changed if r["status"] == "changed"] == sorted(
        f"tiny/{k}/tp{t}/r1" for k in ("embed", "tail") for t in (1, 2)
    )
    assert "4 of 4 builds change against HEAD~1" in first and "bench skipped (no GPU on this machine)" in first
    assert doc["parts"]["bench"]["status"] == "skipped"
    assert "## Builds (build)" in md and "| tiny/tail/tp2/r1 | changed |" in md
    assert p.stdout.strip() == doc["summary"]
    assert "report: part 1 of 3, check" in p.stderr and "report: part 2 of 3, build" in p.stderr


@pytest.mark.slow
@pytest.mark.interpreter
def test_a_bit_change_in_one_kernel_is_one_of_n_differ_naming_the_output(repo, tmp_path):
    """The tail kernel's logits scaled by one ulp's worth in this tree: the tail key differs from HEAD~1 (the
    logits named), the embed key does not; exit 1; the JSON still validates."""
    old = "tl.store(p_o, acc, mask=m_o)"
    edit(repo, "kernels/kinds/tail/kernel.py", old, "tl.store(p_o, acc * 1.0000001, mask=m_o)")
    args = ["--against", "HEAD~1", "--kind", "embed,tail", "--tp", "1", "--rows", "1", "--parts", "check", "--html"]
    p, doc, md = _report(repo, tmp_path, *args)
    assert p.returncode == 1, p.stderr[-3000:]
    jsonschema.validate(doc, SCHEMA)
    assert doc["summary"].startswith("1 of 2 configs bitwise equal to HEAD~1; 1 of 2 configs pass; 1 of 2 differ")
    assert "tiny/tail/tp1/r1: logits" in doc["summary"] and list(doc["parts"]) == ["check"]
    assert "| tiny/tail/tp1/r1 | differ: logits[" in md and "| tiny/embed/tp1/r1 | equal |" in md
    assert "Error: report: check failed" in p.stderr
    assert (tmp_path / "report" / "report.html").read_text().startswith("<!doctype html>")


def _timed_doc(out: Path) -> dict:
    """A report's document as a GPU run writes it, its timing faked (no GPU here): the step's picture saved."""
    (out / "bench").mkdir(parents=True)
    (out / "bench" / "bench-glm53_flash-x-model-tp8-r1.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
    key = {"kind": "model", "tp": 8, "rows": 1, "context": 4096, "us": 5000.0, "pct_copy": 31.9, "floor_us": 1596.0}
    key["against"] = {"ref_us": 5230.1, "ratio": 0.956, "ratio_ci": [0.95, 0.962], "delta": 0.01, "verdict": "faster"}
    results = {
        "bench": {
            "status": "passed",
            "command": "glm53ctl bench --against main --json",
            "exit": 0,
            "seconds": 60.0,
            "summary": "1 key timed against main: 1 faster",
            "doc": {"against": {"ref": "main"}, "keys": [key]},
        }
    }
    return {
        "schema": 1,
        "against": {"ref": "main", "sha": "0" * 40},
        "this": {"sha": "1" * 40, "dirty": False},
        "model": "glm53_flash",
        "keys": {"kinds": ["model"], "tp": [8], "rows": [1], "context": 4096},
        "summary": summary(results, "main"),
        "parts": results,
        "environment": {"glm53ctl": "0.1.0", "python": "3.11", "torch": "2", "triton": "3", "cuda": "12"}
        | {"gpu": "H100", "date": "2026-12-07", "command": "glm53ctl report --against main"},
    }


def test_the_timing_part_reads_as_a_table_and_the_page_inlines_the_step(tmp_path):
    doc = _timed_doc(tmp_path)
    jsonschema.validate(doc, SCHEMA)
    md = markdown(doc, tmp_path)
    assert "| model TP8 r1 4K | 5000.0 | 5230.1 | 0.9560 [0.9500, 0.9620] | 0.0100 | faster | 31.9 | 1596.0 |" in md
    assert "![bench-glm53_flash-x-model-tp8-r1](bench/bench-glm53_flash-x-model-tp8-r1.svg)" in md
    html = page(doc, tmp_path)
    assert "data:image/svg+xml;base64," in html  # self-contained: every source inlined
    assert all(src.startswith("data:") for src in re.findall(r"src='([^']*)'", html))
