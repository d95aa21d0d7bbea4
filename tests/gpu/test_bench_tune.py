"""The GPU tier of `bench` and `tune`: their real paths at glm53_flash sizes, as briefly as they run (the figures
themselves are `glm53ctl bench` / `tune` commands in docs/perf, not tests)."""

import math
import os

import pytest

from glm53ctl.kernels.kinds import kernel_kinds
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the GPU tier runs compiled kernels"),
]


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("glm53_flash"), seed=0, device="cuda")


@pytest.mark.parametrize("kind", kernel_kinds())
def test_bench_key_times_the_launch_and_every_baseline(weights, kind):
    """Every baseline in one process over two keys (a second key once crashed on the first key's Dynamo cache);
    the separate launches, plain and PDL-chained, give the launch's bits."""
    from glm53ctl.tuning.bench import BASELINES, bench_key
    from glm53ctl.tuning.knobs import defaults, resolve_grid

    # dense: one key and no stock baselines (its Inductor compile alone takes a minute; docs/perf has its figures)
    baselines = ("separate", "separate-pdl", "defaults") if kind == "dense" else BASELINES
    for tp in (2,) if kind == "dense" else (1, 2):
        row = bench_key(weights, kind, tp, 2, {}, baselines, rounds=3, copy_tb_s=4.0, trace=True)
        assert row["us"] > 0 and row["bytes"] > 0 and 0 < row["pct_copy"]
        for name in baselines:
            b = row["baselines"][name]
            assert b["us"] > 0 and math.isfinite(b["ratio"]), name
        assert row["baselines"]["separate"]["bitwise_equal"] and row["baselines"]["separate-pdl"]["bitwise_equal"]
        assert row["baselines"]["defaults"]["knobs_equal"] == (row["knobs"] == resolve_grid(defaults(kind), "cuda"))
        if kind == "dense":
            assert [s["stage"] for s in row["trace"]["stages"]][0] == "attn mix"


def test_tune_searches_checks_and_decides(weights, tmp_path):
    from glm53ctl.tuning.tune import GpuEvaluator, decide, search, storage_of

    ev = GpuEvaluator(weights, "tail", 2, 2)
    space = {"gathers": ("first", "last"), "split": ("tiles", "even")}
    study = search(ev, ev.default, space, storage_of(f"sqlite:///{tmp_path / 's.db'}"), "s", trials=4, samples=3)
    assert len(study.trials) == 4 and study.trials[0].params == {"gathers": "last", "split": "even"}
    res = decide(ev, study, ev.default, space, rounds=5, where="at TP2 rows 2")
    assert res.default_us > 0 and res.trials["rejected"] == 0
    assert set(res.kept) <= set(space)
