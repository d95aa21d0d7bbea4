"""What `glm53ctl bench` times, checked on a CPU under the interpreter: each kind's timed launch and its stock
PyTorch baseline compute what the launch computes, the bytes add up, and copies are distinct buffers. (The
timing itself needs a GPU: tests/gpu and `glm53ctl bench` there.)"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

from glm53ctl.kernels.checks import make_harness  # noqa: E402
from glm53ctl.kernels.kinds import kernel_kinds  # noqa: E402
from glm53ctl.kernels.numerics import rel_rms  # noqa: E402
from glm53ctl.kernels.spec import load_model  # noqa: E402
from glm53ctl.kernels.weights import Weights  # noqa: E402

pytestmark = pytest.mark.interpreter

# the output the stock baseline returns, per kind: what it is compared with
LAST = {"embed": "H", "dense": "H", "kda": "H", "sparse": "H", "tail": "logits"}


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=0)


@pytest.mark.parametrize("kind", kernel_kinds())
def test_timed_and_stock_compute_the_launch(weights, kind):
    k = make_harness(weights, kind, 2, 2, {}, "cpu")
    x = k.inputs(seed=3)[0]
    peers = k.peer_partials(x)
    t = k.timed(x, peers)
    assert 0 < t.stream_bytes <= t.nbytes
    copies = t.copies(3)
    assert len(copies) == 3 and copies[0].keys() == copies[1].keys()
    for name in copies[0]:
        assert copies[0][name].data_ptr() != copies[1][name].data_ptr()
    # the first copy is the harness's own: the timed launch gives the launch's outputs
    want = {n: v.clone() for n, v in k(x, peers).items()}
    got = t.call(copies[0])
    if kind != "embed":  # embed rotates token sets: its copies are other inputs
        got = got if isinstance(got, torch.Tensor) else got[LAST[kind]]
        assert torch.equal(got, want[LAST[kind]])
    # rank 0's share as stock bf16 PyTorch: the same math within bf16 rounding
    s = k.stock(x, peers)
    if kind == "embed":
        c = {"tokens": x}
        assert rel_rms(want["H"].float(), s.call(c).float()) == 0.0
    else:
        assert rel_rms(want[LAST[kind]].float(), s.call(s.copies(1)[0]).float()) < 3e-2
    assert s.nbytes == t.nbytes


@pytest.mark.parametrize("kind", kernel_kinds())
def test_separate_pdl_gives_the_launch_bits(weights, kind):
    """The PDL-chained stage launches run the same task bodies (the interpreter has no PDL and ignores it): the
    same bits as the launch."""
    k = make_harness(weights, kind, 2, 2, {}, "cpu")
    x = k.inputs(seed=4)[0]
    peers = k.peer_partials(x)
    want = {n: v.clone() for n, v in k(x, peers, poison=True).items()}
    sep = k.separate(pdl=True)
    assert all(s.pdl for s in sep.launch.stages)
    got = sep(x, peers, poison=True)
    assert all(torch.equal(want[n], got[n]) for n in want)


def test_knobs_parse_to_typed_values():
    from glm53ctl.errors import UsageError
    from glm53ctl.tuning.knobs import parse_knobs

    assert parse_knobs("oproj_first=1, box_words=16,norm=fold,grid=132", "dense") == {
        "oproj_first": 1,
        "box_words": 16,
        "norm": "fold",
        "grid": 132,
    }
    for bad, says in (("oproj_first", "name=value"), ("x=1", "does not apply"), ("norm=maybe", "expected one of")):
        with pytest.raises(UsageError, match=says):
            parse_knobs(bad, "dense")


def test_markdown_names_the_environment_and_every_key():
    from glm53ctl.commands.bench import to_markdown
    from glm53ctl.tuning import measure

    row = {
        "kind": "dense",
        "tp": 4,
        "rows": 1,
        "us": 75.0,
        "floor_us": 35.0,
        "pct_copy": 46.7,
        "bytes": 150e6,
        "copies": 2,
        "rotates": "rank 0's layer weights",
        "baselines": {"separate": {"us": 105.0, "ratio": 1.4, "ratio_ci": (1.39, 1.41), "bitwise_equal": True}},
    }
    doc = {
        "environment": measure.environment("glm53ctl bench --kind dense --tp 4 --rows 1 --baseline separate"),
        "code_digest": "0123456789abcdef",
        "copy_tb_s": 4.29,
        "keys": [row],
        "against": None,
    }
    md = to_markdown(doc)
    assert "`glm53ctl bench --kind dense --tp 4 --rows 1 --baseline separate`" in md
    assert "| dense TP4 r1 | 75.0 | 35.0 | 46.7 | 150.0 | 105.0 (1.40×) |" in md
    assert "2 copies of rank 0's layer weights" in md


def test_a_step_says_where_its_time_goes():
    """A step's row (bench --kind model): the table gains its other chain as a column (a dash where a key has
    none), the breakdown per kind with the gaps, and a well-formed picture with a segment per part."""
    import xml.dom.minidom

    from glm53ctl.commands.bench import _table, format_step, step_picture
    from glm53ctl.kernels.kinds.model import KNOBS

    parts = [
        {"part": "embed", "kind": "embed", "us": 5.0, "bytes": 1e5},
        {"part": "layers.0", "kind": "kda", "us": 60.0, "bytes": 80e6},
        {"part": "layers.1", "kind": "sparse", "us": 200.0, "bytes": 100e6},
        {"part": "tail", "kind": "tail", "us": 50.0, "bytes": 150e6},
    ]
    row = {
        "kind": "model",
        "tp": 8,
        "rows": 1,
        "context": 4096,
        "us": 320.0,
        "floor_us": 80.0,
        "pct_copy": 25.0,
        "bytes": 330e6,
        "tokens_per_s": 1e6 / 320.0,
        "parts": parts,
        "parts_us": 315.0,
        "gaps_us": 5.0,
        "by_kind": {p["kind"]: {"parts": 1, "us": p["us"], "share": p["us"] / 320.0} for p in parts},
        "baselines": {"chain=pdl": {"us": 330.0, "ratio": 1.03, "ratio_ci": (1.02, 1.04)}},
    }
    other = dict(row, kind="tail", context=None, baselines={})
    cols, rows = _table([row, other], None)
    assert cols[-1] == "chain=pdl µs (×)" and rows[0][-1] == "330.0 (1.03×)" and rows[1][-1] == "—"
    text = format_step(row)
    assert "model TP8 r1 4K: 320.0 µs per step, 3125 tokens/s per rank" in text
    assert "| sparse | 1 | 200.0 | 62.5% |" in text and "| gaps (step − sum) | | 5.0 | 1.6% | |" in text
    svg = step_picture(row)
    xml.dom.minidom.parseString(svg)
    assert svg.count("<title>layers.") == 2 and "floor: 80 µs" in svg
    assert {k.name: k.default for k in KNOBS} == {"chain": "stream"}


def test_a_steps_launches_chain_as_its_knob_says():
    """`chain pdl`: every part's own launch made chained by programmatic dependent launch (a peer's launch, the
    emulation, never); `stream` (the default): none."""
    from glm53ctl.kernels.kinds.model.harness import ModelHarness

    spec = load_model("tiny")
    for chain, want in (("pdl", True), ("stream", False)):
        launches = ModelHarness.build_launches(spec, 2, 1, {"chain": chain, "grid": 0})
        assert sum(n.endswith(".launch") for n, _ in launches) == spec.model.num_layers + 2
        assert any(n.endswith(".peer") for n, _ in launches)
        assert {n: la.pdl for n, la in launches if n.endswith(".launch")} == {
            n: want for n, la in launches if n.endswith(".launch")
        }
        assert not any(la.pdl for n, la in launches if n.endswith(".peer"))


def test_a_trial_is_checked_as_its_knobs_class_asks(weights):
    """tune's evaluator on the interpreter: a schedule knob must keep every bit (oproj_first does), a numeric
    knob must stay within the reference bounds (block_k does); a launch that changes a bit under a schedule knob
    is rejected with the outputs named."""
    from glm53ctl.tuning.tune import GpuEvaluator

    ev = GpuEvaluator(weights, "dense", 2, 2, seed=0, device="cpu")
    d = ev.default
    assert ev.check(d) is None
    assert ev.check(d | {"oproj_first": 1}) is None
    assert ev.check(d | {"block_k": 64}) is None
    assert ev.identity(d) != ev.identity(d | {"oproj_first": 1})
    ev.default_out = {n: t + 1 if n == "H" else t for n, t in ev.default_out.items()}  # as if the default moved
    assert ev.check(d | {"oproj_first": 1}) == "not bitwise equal to the default: H"


def test_a_tree_that_cannot_time_a_key_says_why(tmp_path):
    """`bench --against REF`'s worker that cannot set its key up answers why, in one line, and the error names
    the tree and the key: a tree from before --context (its harness takes none), and, on a machine without a
    GPU, this very tree."""
    from glm53ctl.errors import Glm53Error
    from glm53ctl.tuning.ab import Worker
    from glm53ctl.worktree import this_tree

    old = tmp_path / "old"  # this tree but for its kernels, whose make_harness predates contexts
    (old / "kernels").mkdir(parents=True)
    (old / "kernels" / "__init__.py").write_text("")
    for pkg in ("glm53ctl", "tuning", "configs"):
        (old / pkg).symlink_to(this_tree() / pkg)
    (old / "kernels" / "spec.py").write_text("def load_model(name):\n    return name\n")
    (old / "kernels" / "weights.py").write_text("class Weights:\n    def __init__(self, *a, **k):\n        pass\n")
    (old / "kernels" / "checks.py").write_text("def make_harness(w, kind, tp, rows, knobs, device):\n    pass\n")
    with pytest.raises(Glm53Error, match=r"old: cannot time sparse TP2 rows 1 at context 4096: .*predates --context"):
        Worker(old, "tiny", "sparse", 2, 1, {}, 0, 4096)
    if not torch.cuda.is_available():
        with pytest.raises(Glm53Error, match=r"cannot time dense TP1 rows 1: .*(CUDA|cuda)"):
            Worker(this_tree(), "tiny", "dense", 1, 1, {}, 0)
