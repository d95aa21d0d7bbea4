"""Every bad input of tests/cli/bad_inputs.py: an `Error:` saying what it is, a `Hint:`, exit 2, no traceback,
nothing on stdout (issue 30: the table in its closing note is this list's)."""

from __future__ import annotations

import pytest

from tests.cli.bad_inputs import CASES, args_of, error_of, place
from tests.helpers import invoke


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    return place(tmp_path_factory.mktemp("bad") / "D")


@pytest.mark.parametrize("case, says", CASES, ids=[c for c, _ in CASES])
def test_bad_input_is_a_clear_error(capsys, monkeypatch, tmp_path, here, case, says):
    monkeypatch.chdir(tmp_path)  # what a command would make by default (build/, studies.db) lands here
    monkeypatch.setattr("glm53ctl.commands.tune.gpu_count", lambda: 0)
    code, out, err = invoke(capsys, *args_of(case, here))
    assert code == 2, (case, code, err)
    assert "Traceback" not in err and "Traceback" not in out, err
    assert out == "" or case.startswith(("configs validate", "configs migrate")), out  # their per-file report
    assert err.lstrip().startswith("Error:"), err
    assert says in error_of(err).replace(str(here), "{here}"), (says, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "a refused command made something"
