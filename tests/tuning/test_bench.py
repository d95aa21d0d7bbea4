"""What `glm53ctl bench` times, checked on a CPU under the interpreter: each kind's timed launch and its stock
PyTorch baseline compute what the launch computes, the bytes add up, and copies are distinct buffers. (The
timing itself needs a GPU: tests/gpu and `glm53ctl bench` there.)"""

import os
import re

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")

from glm53ctl.kernels.checks import make_harness
from glm53ctl.kernels.kinds import kernel_kinds  # noqa: E402
from glm53ctl.kernels.numerics import rel_rms  # noqa: E402
from glm53ctl.kernels.spec import load_model  # noqa: E402
from glm53ctl.kernels.weights import Weights  # noqa: E402
from glm53ctl.tuning.knobs import resolve_key  # noqa: E402
from tests.helpers import resolved  # noqa: E402

pytestmark = pytest.mark.interpreter

# the output the stock baseline returns, per kind: what it is compared with
LAST = {"embed": "H", "dense": "H", "kda": "H", "sparse": "H", "tail": "logits"}


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=0)


@pytest.mark.parametrize("kind", kernel_kinds())
def test_timed_and_stock_compute_the_launch(weights, kind):
    k = make_harness(weights, resolved(kind, 2, 2))
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
    k = make_harness(weights, resolved(kind, 2, 2))
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
    step = row | {"kind": "model", "copies": 2, "rotates": "nothing: the step's layers share weights in turn"}
    md = to_markdown(doc | {"keys": [step]})
    assert "model: nothing: the step's layers share weights in turn" in md and "copies of nothing" not in md


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
    assert {k.name: k.default for k in KNOBS} == {"launch": "parts", "chain": "stream"}


def test_a_steps_launches_chain_as_its_knob_says():
    """`chain pdl`: every part's own launch made chained by programmatic dependent launch (a peer's launch, the
    emulation, never); `stream` (the default): none."""
    from glm53ctl.kernels.kinds.model.harness import ModelHarness

    spec = load_model("tiny")
    for chain, want in (("pdl", True), ("stream", False)):
        launches = ModelHarness.build_launches(spec, resolve_key("tiny", "model", 2, 1, {"chain": chain}, "cpu"))
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


# a tree's kernels for `bench --against` on a CPU: a harness whose launches only count themselves, and a fake of
# the timing code (loaded by the worker by path, as tuning/measure.py is) that gives US µs per launch
FAKE_CHECKS = """
US = {us}
CALLS = []


class Timed:
    stream_bytes = nbytes = 1000

    def copies(self, n):
        return [{{"w": i}} for i in range(n)]

    def call(self, c):
        CALLS.append(c)


class Harness:
    def inputs(self, seed):
        return [seed]

    def peer_partials(self, x):
        return None

    def __call__(self, x, peers):
        return {{}}

    def timed(self, x, peers):
        return Timed()


def make_harness(weights, key):
    if {fail!r}:
        raise RuntimeError({fail!r})
    h = Harness()
    h.knobs = {{"tree": {name!r}, "kind": key.kind, "tp": key.tp, "rows": key.rows, "context": key.context}} | key.knobs
    return h
"""
# the worker resolves its key in its own tree
FAKE_KNOBS = """
from types import SimpleNamespace


def resolve_key(model, kind, tp, rows, knobs, device, context=None):
    return SimpleNamespace(kind=kind, tp=tp, rows=rows, knobs=dict(knobs or {}), context=context, warnings=())
"""
FAKE_MEASURE = """
from glm53ctl.kernels import checks  # the worker's tree's


def rotations(stream_bytes):
    return 3


def graph_timer(fn, inner):
    def replay():
        n = len(checks.CALLS)
        for _ in range(inner):
            fn()
        return checks.US * (len(checks.CALLS) - n) / inner

    return replay
"""


def _tree(root, name: str, worker: str | None = None, us: float = 1.0, fail: str = ""):
    """A glm53ctl tree in root/name: this tree's glm53ctl, fake kernels (FAKE_CHECKS), and a worker: this tree's
    tuning/bench_worker.py, or the text given (a tree of another protocol version)."""
    from glm53ctl.worktree import this_tree

    tree = root / name
    (tree / "kernels").mkdir(parents=True)
    (tree / "tuning").mkdir()
    (tree / "glm53ctl").symlink_to(this_tree() / "glm53ctl")
    (tree / "kernels" / "__init__.py").write_text("")
    (tree / "kernels" / "spec.py").write_text("def load_model(name):\n    return name\n")
    (tree / "kernels" / "weights.py").write_text("class Weights:\n    def __init__(self, *a, **k):\n        pass\n")
    (tree / "kernels" / "checks.py").write_text(FAKE_CHECKS.format(us=us, name=name, fail=fail))
    text = (this_tree() / "tuning" / "bench_worker.py").read_text() if worker is None else worker
    (tree / "tuning" / "bench_worker.py").write_text(text)
    (tree / "tuning" / "__init__.py").write_text("")
    (tree / "tuning" / "knobs.py").write_text(FAKE_KNOBS)
    return tree


def test_against_times_each_tree_by_its_own_worker(tmp_path, monkeypatch):
    """`bench --against`'s whole path on a CPU, the GPU's timing faked: each tree's worker (this tree's file, in
    two trees) speaks the protocol, takes the key, sets it up with its tree's kernels and answers rounds timed by
    the parent's timing code; the ratio and the verdict are this tree's against REF's."""
    from glm53ctl.tuning import ab

    (tmp_path / "measure.py").write_text(FAKE_MEASURE)
    monkeypatch.setattr(ab, "MEASURE", tmp_path / "measure.py")
    this, ref = _tree(tmp_path, "this", us=6.0), _tree(tmp_path, "ref", us=3.0)
    got = ab.against(this, ref, "tiny", "sparse", 2, 1, {"grid": 7}, 5, rounds=3, context=4096)
    assert (got["this_us"], got["ref_us"], got["ratio"], got["ratio_ci"]) == (6.0, 3.0, 2.0, (2.0, 2.0))
    assert got["same"]["ratio"] == 1.0 and got["delta"] == 0.01 and got["verdict"] == "slower"
    key = {"kind": "sparse", "tp": 2, "rows": 1, "context": 4096, "grid": 7}
    assert got["this_knobs"] == {"tree": "this"} | key and got["ref_knobs"] == {"tree": "ref"} | key
    assert got["bytes"] == 1000


def test_a_tree_that_cannot_time_a_key_says_why(tmp_path, monkeypatch):
    """A worker that cannot set its key up answers why, in one line, and the error names the tree and the key: a
    tree whose harness refuses it, and, on a machine without a GPU, this very tree (whose worker speaks the
    version this parent speaks)."""
    from glm53ctl.errors import Glm53Error
    from glm53ctl.tuning import ab
    from glm53ctl.tuning.ab import SPEAKS, Worker
    from glm53ctl.worktree import this_tree

    (tmp_path / "measure.py").write_text(FAKE_MEASURE)
    monkeypatch.setattr(ab, "MEASURE", tmp_path / "measure.py")
    w = Worker(_tree(tmp_path, "refusing", fail="no such context"))
    with pytest.raises(
        Glm53Error, match=r"refusing: cannot time sparse TP2 rows 1 at context 4096: RuntimeError: no such"
    ):
        w.set_up("tiny", "sparse", 2, 1, {}, 0, 4096)
    assert w.p.poll() is not None
    monkeypatch.undo()  # this tree's worker with this checkout's timing code
    w = Worker(this_tree())
    assert w.version == max(SPEAKS)
    if not torch.cuda.is_available():
        with pytest.raises(Glm53Error, match=r"cannot time dense TP1 rows 1: .*(CUDA|cuda)"):
            w.set_up("tiny", "dense", 1, 1, {}, 0)
    w.close()


# what a worker says first, and what this parent answers: every worker is made to record that it exits by itself
# (not killed) once refused
PREDATES = """import sys
print("ready 1000 2 {}", flush=True)  # a worker from before the protocol: the key as its argv, then ready
for line in sys.stdin:
    if line.strip() != "round":
        break
    print(1.0, flush=True)
"""


@pytest.mark.parametrize(
    ("first", "says", "hint"),
    [
        (None, r"no bench worker \(tuning/bench_worker.py\): it is too old", "an older tree's bench drives"),
        (
            PREDATES,
            r"its bench worker is too old: it says no hello \(it predates the versioned protocol\)",
            "an older tree's bench",
        ),
        (
            'print("error IndexError: list index out of range")',
            r"its bench worker is too old: it says no hello",
            "an older tree's",
        ),
        (
            'print("hello glm53ctl-bench 0")',
            r"its bench worker is too old: it speaks glm53ctl-bench 0",
            "an older tree's bench drives",
        ),
        (
            'print("hello glm53ctl-bench 2")',
            r"its bench worker is too new: it speaks glm53ctl-bench 2",
            "update this checkout",
        ),
        (
            'print("hello other-bench 1")',
            r"its bench worker speaks another protocol: its hello is 'hello other-bench 1'",
            "update this",
        ),
    ],
    # no-hello-error: what a worker from before the protocol says first when given no argv (as this parent gives)
    ids=["no-worker", "no-hello", "no-hello-error", "older", "newer", "another"],
)
def test_a_ref_whose_worker_speaks_no_version_of_ours_is_refused(tmp_path, first, says, hint):
    """Before this tree's worker starts or any key is set up: one line naming the tree, what its worker is and
    what this glm53ctl speaks, exit 2, and a hint of what to do (run bench from that ref's checkout
    --against this tree); a worker that was started exits."""
    from glm53ctl.errors import EXIT_USAGE
    from glm53ctl.tuning import ab
    from glm53ctl.worktree import this_tree

    ref = _tree(
        tmp_path,
        "ref",
        worker=first and f"{first}\nimport sys\nsys.stdin.read()\nopen({str(tmp_path / 'exited')!r}, 'w')\n",
    )
    if first is None:
        (ref / "tuning" / "bench_worker.py").unlink()
    this = _tree(tmp_path, "this", worker=f"open({str(tmp_path / 'this-started')!r}, 'w')\n")
    with pytest.raises(ab.WorkerRefused, match=f"^{re.escape(str(ref))}: {says}") as e:
        ab.against(this, ref, "tiny", "dense", 1, 1, {}, 0, rounds=3)
    assert e.value.exit_code == EXIT_USAGE and str(e.value).endswith("; this glm53ctl speaks glm53ctl-bench 1")
    assert "\n" not in str(e.value) and hint in e.value.hint and f"--against {this_tree()}" in e.value.hint
    assert not (tmp_path / "this-started").exists()
    assert (tmp_path / "exited").exists() == (first is not None)


def test_the_step_over_the_matrix_in_one_picture(tmp_path):
    """`bench --save` of `model` keys: the step over TP x rows, a panel per context, each cell its µs per step, %
    of the copy bandwidth and the compiled step where timed; a key not timed is a cell that says so. The keys come
    from every bench JSON in the folder, the newest per key, an unreadable file skipped and named."""
    import json
    import xml.dom.minidom

    from glm53ctl.pictures import matrix_picture, saved_steps

    def step(tp, rows, us, compile_us=None, context=4096):
        r = {"kind": "model", "tp": tp, "rows": rows, "context": context, "us": us, "pct_copy": 20.0,
             "floor_us": 0.2 * us, "tokens_per_s": rows * 1e6 / us, "baselines": {}}  # fmt: skip
        if compile_us:
            r["baselines"]["compile"] = {"us": compile_us, "ratio": compile_us / us}
        return r

    def save(stamp, keys):
        (tmp_path / f"bench-glm53_flash-{stamp}.json").write_text(json.dumps({"keys": keys}))

    save("2026-12-01T000000", [step(8, 1, 6000.0), step(8, 8, 10400.0)])
    save("2026-12-02T000000", [step(8, 1, 5850.0, 15594.0), step(4, 1, 9000.0, context=32768)])
    (tmp_path / "bench-glm53_flash-2026-12-03T000000.json").write_text("{not json")
    rows, skipped = saved_steps(tmp_path, "glm53_flash")
    assert skipped == ["bench-glm53_flash-2026-12-03T000000.json"]
    assert sorted((r["tp"], r["rows"], r["context"], r["us"]) for r in rows) == [
        (4, 1, 32768, 9000.0), (8, 1, 4096, 5850.0), (8, 8, 4096, 10400.0)]  # fmt: skip
    svg = matrix_picture(rows, "glm53_flash step", (1, 2, 4, 8), (1, 2, 4, 8))
    xml.dom.minidom.parseString(svg)
    assert "context 4K" in svg and "context 32K" in svg
    assert svg.count("not timed") == 2 * 16 - 3  # two panels of TP 1/2/4/8 x rows 1/2/4/8, three keys timed
    assert "5.85 ms · 20.0%" in svg and "compiled 15.6 ms: 2.67×" in svg and "10.4 ms · 20.0%" in svg
    from glm53ctl.commands.bench import _save

    _save(tmp_path, {"model": "glm53_flash", "environment": {"gpu_name": "NVIDIA H200"}, "keys": [step(2, 2, 20000.0)]})
    svg = (tmp_path / "bench-glm53_flash-model-matrix.svg").read_text()
    assert "glm53_flash step on NVIDIA H200" in svg and "20 ms · 20.0%" in svg and "5.85 ms" in svg


def test_a_traced_step_says_which_kind_and_stage_hold_it():
    """`bench --trace --kind model`: each part's critical path split by its kind's stages (a step's work and the
    hand-off before it, to its type's stage), per kind the mean traced launch and the stage holding the most of
    its parts' paths, printed with the longest parts."""
    from glm53ctl.commands.bench import format_step_trace
    from glm53ctl.kernels.ops.dsa.tasks import Attn, Select
    from glm53ctl.kernels.ops.gemv.tasks import OProj
    from glm53ctl.tuning.bench import path_by_stage, step_kinds

    def step(t, ready, done, handoff=None):
        s = {"type": t, "ready": ready, "done": done}
        return s | ({"handoff": handoff} if handoff is not None else {})

    names = {t.NAME: t.ID for t in (Select, Attn, OProj)}
    stages = ((names["index select"],), (names["mla attention"], names["o_proj"]))
    traced = {"critical_path": [step("index select", 0.0, 30.0), step("mla attention", 32.0, 40.0, 2.0),
                                step("o_proj", 40.5, 50.0, -1.0), step("embed gather", 50.0, 51.0, 0.0)]}  # fmt: skip
    path = path_by_stage(traced, stages)
    assert path == {"index select": 30.0, "mla attention+o_proj": 8.0 + 2.0 + 9.5, "other": 1.0}
    parts = [
        {"part": "layers.3", "kind": "sparse", "us": 170.0, "path": {"index select": 60.0, "attn": 20.0}, "holds": ""},
        {"part": "layers.7", "kind": "sparse", "us": 160.0, "path": {"index select": 40.0, "attn": 40.0}, "holds": ""},
        {"part": "layers.4", "kind": "kda", "us": 85.0, "path": {"gates": 30.0, "experts": 20.0}, "holds": "gates"},
    ]
    kinds = step_kinds(parts)
    assert kinds["sparse"] == {"parts": 2, "us": 165.0, "holds": "index select", "holds_us": 50.0, "holds_share": 0.625}
    assert kinds["kda"]["holds"] == "gates" and kinds["kda"]["holds_share"] == 0.6
    text = format_step_trace({"parts": parts, "by_kind": kinds})
    assert "| sparse | 2 | 165.0 | index select | 50.0 (62%) |" in text
    assert text.splitlines()[-1].startswith("longest: layers.3 (sparse) 170.0 µs")


def test_a_key_timed_on_real_ranks_shows_beside_the_emulation():
    """`bench --gpus T`: a row with its real ranks' figure gains two columns (µs per launch on the ranks with its
    ratio to the emulation's, and the slowest rank's median), and its summary line says it; a row without has
    dashes there."""
    from glm53ctl.commands.bench import _summary_line, _table

    row = {"kind": "dense", "tp": 2, "rows": 1, "us": 100.0, "floor_us": 40.0, "pct_copy": 40.0, "bytes": 8e7,
           "baselines": {}, "ranks": {"us": 92.0, "per_rank_us": [91.0, 92.5], "ratio": 0.92}}  # fmt: skip
    cols, rows = _table([row, dict(row, kind="kda", ranks=None)], None)
    assert cols[-2:] == ["real ranks µs (× emulation)", "slowest rank µs"]
    assert rows[0][-2:] == ["92.0 (0.92×)", "92.5"] and rows[1][-2:] == ["—", "—"]
    assert "on 2 real ranks 92.0 us (0.92x the emulation)" in _summary_line(row)
