import pytest

from glm53ctl.errors import UsageError
from glm53ctl.tuning.knobs import KNOBS, check_knobs, defaults, resolve_grid


def test_every_knob_default_is_one_of_its_values():
    for k in KNOBS.values():
        assert k.default in k.values and k.cls in ("schedule", "numeric") and k.kinds


def test_defaults_per_kind():
    assert set(defaults("tail")) >= {"grid", "handoff", "poll", "block_n", "block_k", "stages", "warps"}
    assert "block_n" not in defaults("embed") and "chunk" in defaults("embed")


def test_bad_knobs_are_refused():
    with pytest.raises(UsageError, match="knob 'chunk' does not apply to tail"):
        check_knobs("tail", {"chunk": 256})
    with pytest.raises(UsageError, match="knob handoff='mail': expected one of flag, box"):
        check_knobs("tail", {"handoff": "mail"})


def test_grid_zero_resolves_per_device():
    assert resolve_grid({"grid": 0}, "cpu")["grid"] == 4
    assert resolve_grid({"grid": 7}, "cpu")["grid"] == 7
