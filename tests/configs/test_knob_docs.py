"""docs/knobs.md's tables are the registry's (glm53ctl/knob_docs.py): a knob changed without them fails here."""

import re

import pytest

from glm53ctl import knob_docs
from glm53ctl.kernels.kinds import KINDS
from glm53ctl.knob_docs import COMMAND, DOC, KnobDocsError, main, regenerate, render
from glm53ctl.tuning.knobs import Knob, kind_knobs


def test_the_pages_tables_are_the_registrys():
    text = DOC.read_text()
    drift = knob_docs.diff(text)
    assert not drift, f"docs/knobs.md's knob tables differ from the registry: run `{COMMAND}`\n{drift}"


def test_every_knob_of_every_kind_is_on_the_page():
    regions = render()
    assert list(regions) == ["shared", *KINDS]
    page = "\n".join(regions.values())
    for kind in KINDS:
        for name in kind_knobs(kind):
            assert f"`{name}`" in page or f"`{name}=" in regions[kind], (kind, name)


def test_values_and_defaults_are_printed_plainly():
    rows = [line for body in render().values() for line in body.splitlines() if line.startswith("| `")]
    assert rows
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        # knob, class, values, default: no Python reprs (`('a', 'b')`, `'box'`)
        for cell in cells[2:4]:
            assert "'" not in cell and "(" not in cell and "[" not in cell, row


def _reg(**kinds):
    return {kind: {k.name: k for k in knobs} for kind, knobs in kinds.items()}


GRID = Knob("grid", (0, 132), 0, "schedule", "programs")
X = Knob("x", (1, 2), 1, "numeric", "the x")
Y = Knob("y", ("a", "b"), "a", "schedule", "the y")


def test_a_knob_of_a_kind_others_build_on_is_that_kinds():
    z = Knob("z", (0, 1), 0, "schedule", "the z")
    reg = _reg(base=[GRID, X], more=[GRID, X, Y], other=[Knob("grid", (0, 132), 4, "schedule", "programs"), z])
    regions = render(reg)
    # grid: shared (`other` and `base` do not nest), with each kind's default
    assert "| `grid` | schedule | 0, 132 | base, more: 0; other: 4 | all | programs |" in regions["shared"]
    assert "`x`" not in regions["shared"]
    assert "| `x` | numeric | 1, 2 | 1 | the x |" in regions["base"]
    assert "Every knob of `base`, with the same defaults." in regions["more"]
    assert "| `y` | schedule | `a`, `b` | `a` | the y |" in regions["more"]
    assert "`x`" not in regions["more"]
    assert "at its defaults: `grid=4`." in regions["other"]
    assert "| `z` | schedule | 0, 1 | 0 | the z |" in regions["other"]


def test_a_kind_of_shared_knobs_only_owns_none():
    # `toy` takes only `grid`, which `base` and `other` (that do not nest) take too
    reg = _reg(base=[GRID, X], other=[GRID, Y], toy=[GRID])
    regions = render(reg)
    assert "`grid`" in regions["shared"]
    assert regions["toy"].endswith("No knobs of its own.")
    assert "Every knob" not in regions["base"] + regions["other"]


def test_a_default_that_differs_from_the_kinds_it_builds_on_is_named():
    reg = _reg(base=[X], more=[Knob("x", (1, 2), 2, "numeric", "the x"), Y])
    assert "with the same defaults but `x=2` (`base`: `x=1`)" in render(reg)["more"]


def test_two_knobs_of_one_name_that_differ_are_two_knobs():
    reg = _reg(a=[GRID, X], b=[GRID, Knob("x", (1, 2, 4), 1, "numeric", "another x")])
    regions = render(reg)
    assert "| `x` | numeric | 1, 2 | 1 | the x |" in regions["a"]
    assert "| `x` | numeric | 1, 2, 4 | 1 | another x |" in regions["b"]


PAGE = """# Knobs

Prose that quotes a marker: `<!-- knobs:begin NAME -->`.

<!-- knobs:begin shared -->
an old table
<!-- knobs:end shared -->

## `a`

What `a` is.

<!-- knobs:begin a -->
<!-- knobs:end a -->

More prose | with a pipe.

## Tuning
"""


def test_writing_rewrites_the_regions_only():
    new = regenerate(PAGE, {"shared": "SHARED TABLE", "a": "A TABLE"})
    assert "an old table" not in new
    outside = re.sub(r"^<!-- knobs:begin (\S+) -->\n.*?^<!-- knobs:end \1 -->$", "", new, flags=re.S | re.M)
    assert outside == re.sub(r"^<!-- knobs:begin (\S+) -->\n.*?^<!-- knobs:end \1 -->$", "", PAGE, flags=re.S | re.M)
    assert "<!-- knobs:begin a -->\n" in new and "\n\nA TABLE\n\n<!-- knobs:end a -->" in new
    assert regenerate(new, {"shared": "SHARED TABLE", "a": "A TABLE"}) == new


def test_a_new_kind_gets_a_section_after_the_last_kinds():
    new = regenerate(PAGE, {"shared": "S", "a": "A", "toy": "TOY"})
    assert new.index("<!-- knobs:end a -->") < new.index("## `toy`") < new.index("More prose")
    assert "<!-- knobs:begin toy -->" in new and "TOY" in new


@pytest.mark.parametrize(
    "page, regions, says",
    [
        (PAGE, {"shared": "S"}, "a table for a, which the registry does not list: remove its section"),
        (PAGE.replace("<!-- knobs:end a -->\n", ""), {"shared": "S", "a": "A"}, "has no `<!-- knobs:end a -->`"),
        (
            PAGE.replace("<!-- knobs:begin shared -->\nan old table\n<!-- knobs:end shared -->\n", ""),
            {"shared": "S", "a": "A"},
            "no `<!-- knobs:begin shared -->`",
        ),
    ],
)
def test_markers_that_do_not_match_the_registry_are_refused(page, regions, says):
    with pytest.raises(KnobDocsError, match=re.escape(says)):
        regenerate(page, regions)


def test_the_command_checks_and_writes(tmp_path, capsys):
    page = tmp_path / "knobs.md"
    page.write_text(regenerate(DOC.read_text()).replace("| `grid` |", "| `grid_old` |", 1))
    assert main(["--check", "--path", str(page)]) == 1
    out, err = capsys.readouterr()
    assert "grid_old" in out and COMMAND in err
    assert main(["--write", "--path", str(page)]) == 0
    assert main(["--check", "--path", str(page)]) == 0
    assert page.read_text() == DOC.read_text()
