"""The persistent launch runtime with its first kinds, embed and tail, under TRITON_INTERPRET=1 on `tiny`."""

import os

import pytest
import torch
import triton
import triton.language as tl

from glm53ctl.kernels.checks import make_harness
from glm53ctl.kernels.kinds import get_kind, kernel_kinds
from glm53ctl.kernels.kinds.harness import RunKey
from glm53ctl.kernels.kinds.run_key import run_reference, run_triton
from glm53ctl.kernels.numerics import rel_rms
from glm53ctl.kernels.ops.embed.tasks import EMBED_GATHER, EmbedGather
from glm53ctl.kernels.reference import Reference
from glm53ctl.kernels.runtime import LaunchFault
from glm53ctl.kernels.runtime.device import TASK_FIELDS
from glm53ctl.kernels.runtime.table import BOX, FLAG, PEER, TaskTable
from glm53ctl.kernels.runtime.tasks import HOP, Hop
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights
from glm53ctl.tuning.knobs import kind_knobs
from tests.helpers import assert_same_bits, resolved

pytestmark = pytest.mark.interpreter

# a bound per output: the kind registry's (logits read a bf16 ĥ through a bf16 GEMV with fp32 accumulation)
BOUNDS = {**get_kind("embed").bounds, **get_kind("tail").bounds}


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """Outputs come from torch.empty: fill them with NaN so an unwritten element fails."""
    real_empty = torch.empty

    def empty(*args, **kw):
        t = real_empty(*args, **kw)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", empty)


@pytest.fixture(scope="module")
def weights():
    return Weights(load_model("tiny"), seed=11)


@pytest.mark.parametrize("kind", ["embed", "tail"])
@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
def test_against_the_reference(weights, kind, tp, rows):
    key = RunKey(kind, tp, rows, seed=100 * tp + rows)  # fresh inputs per key
    ref = run_reference(Reference(weights, tp), key)
    out = run_triton(weights, key, resolved(kind, tp, rows, {"grid": 3}))
    for name in (n for n in ref if n.startswith("outputs.")):
        err = rel_rms(ref[name], out[name])
        assert err <= BOUNDS[name.removeprefix("outputs.")], (name, err)
    if kind == "embed":  # a gather and a sum where one rank owns the row: exact
        assert torch.equal(out["outputs.H"].float(), ref["outputs.H"])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("rows", [1, 4, 5, 8])
def test_tail_with_the_norm_weight_in_lm_head_or_not(weights, tp, rows):
    """`norm` is numeric: the default ("fold": GEMV tasks stream H's 4R stream rows, padded to 16 or 32, and
    scale at their end by the NORM tasks' 1/RMS) is checked by test_against_the_reference; here "task"."""
    key = RunKey("tail", tp, rows, seed=300 + 10 * tp + rows)
    ref = run_reference(Reference(weights, tp), key)
    out = run_triton(weights, key, resolved("tail", tp, rows, {"grid": 3, "norm": "task"}))
    assert torch.equal(out["outputs.h_hat"], ref["outputs.h_hat"])  # the NORM tasks still write ĥ
    assert rel_rms(ref["outputs.logits"], out["outputs.logits"]) <= BOUNDS["logits"]


def _launch(weights, kind, tp, rows, **knobs):
    k = make_harness(weights, resolved(kind, tp, rows, knobs))
    x = k.inputs(seed=7)[0]
    return k, x, k.peer_partials(x)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("kind", ["embed", "tail"])
def test_bitwise_across_grids_and_every_schedule_knob(weights, kind):
    """Every value of every schedule knob (docs/design.md §5), grids 1, 3 and many: the same bits.
    Numeric knobs change the reduction order: within the reference bound instead."""
    base_k, x, peers = _launch(weights, kind, 2, 3, grid=1)
    base = base_k(x, peers)
    # stages (a compile option), poll and prefetch (inline asm) change nothing the interpreter runs: the GPU
    # checks them (tests/gpu)
    gpu_only = ("stages", "maxnreg", "poll", "prefetch")
    for knob in (k for k in kind_knobs(kind).values() if k.name not in gpu_only):
        values = (3, 64) if knob.name == "grid" else knob.values
        for value in values:
            k, _, _ = _launch(weights, kind, 2, 3, **{knob.name: value})
            out = k(x, peers)
            if knob.cls == "schedule":
                assert _same(base, out), (knob.name, value)
            else:
                assert all(rel_rms(base[n], out[n]) <= BOUNDS[n] for n in base), (knob.name, value)
    if kind == "tail":  # rows dealt evenly (the default): tasks of 4 and of 9 lm_head rows instead of 64
        for grid in (64, 130):
            k, _, _ = _launch(weights, kind, 2, 3, grid=grid)
            assert k.launch.table.tasks[-1][2] < 64 and _same(base, k(x, peers)), grid


@pytest.mark.parametrize("kind", ["embed", "tail"])
def test_three_launches_without_host_reset(weights, kind):
    k, x, peers = _launch(weights, kind, 4, 2, grid=3)
    outs = [k(x, peers) for _ in range(3)]
    assert _same(outs[0], outs[1]) and _same(outs[1], outs[2])
    assert k.launch.runtime.epoch == 3  # the tag advanced once per launch, on the device
    assert int(k.launch.runtime.ctl[1]) == 0 and int(k.launch.runtime.ctl[2]) == 0  # counters reset by the last program


@pytest.mark.parametrize(
    "kind, knobs",
    [
        ("embed", {}),
        ("tail", {"block_n": 128}),
        ("tail", {"block_n": 128, "norm": "task", "split": "tiles", "gathers": "first"}),
    ],
)
@pytest.mark.parametrize("handoff", ["flag", "box"])
def test_each_site_stuck_is_named_and_the_next_launch_is_clean(weights, kind, knobs, handoff):
    """Every site stuck in turn; with `norm` "fold" a GEMV task's site is waited at its end."""
    k, x, peers = _launch(weights, kind, 2, 2, grid=3, handoff=handoff, **knobs)
    clean = k(x, peers)
    table = k.launch.table
    assert len(table.sites) >= 2
    for site in range(len(table.sites)):
        with pytest.raises(LaunchFault) as e:
            k(x, peers, stuck_site=site)
        s = table.sites[site]
        assert e.value.site == site and e.value.kind == kind
        assert e.value.task == table.describe_task(s.task)
        assert table.describe_task(s.producers[0]) in e.value.producer
        assert _same(clean, k(x, peers)), site  # nothing lost: the retried launch gives the clean bits


@pytest.mark.parametrize(("v_local", "tp", "rows", "grid"), [(19360, 8, 1, 396), (38720, 4, 8, 396), (512, 2, 3, 7)])
def test_tail_split_even_deals_every_row_once(v_local, tp, rows, grid):
    """split "even": the lm_head rows covered exactly once, at most block_n a task, the same number of tasks
    for every program left after the NORM tasks and those kept for the gathers (one in 16)."""
    from glm53ctl.kernels.kinds.tail.table import SPARE_EVERY, build_table
    from glm53ctl.kernels.ops.tail.tasks import TAIL_GATHER, TAIL_LM_HEAD

    t = build_table(rows, v_local, tp, 64, "box", "last", "even", grid)
    gemv = [task for task in t.tasks if task[0] == TAIL_LM_HEAD.value]
    assert sorted((a0, a0 + a1) for _, a0, a1, _ in gemv) == [(a0, a0 + a1) for _, a0, a1, _ in gemv]
    assert gemv[0][1] == 0 and all(g[1] + g[2] == h[1] for g, h in zip(gemv, gemv[1:], strict=False))
    assert gemv[-1][1] + gemv[-1][2] == v_local and max(a1 for _, _, a1, _ in gemv) <= 64
    free = grid - rows - min(grid // SPARE_EVERY, sum(task[0] == TAIL_GATHER.value for task in t.tasks))
    rounds = triton.cdiv(triton.cdiv(v_local, 64), free)  # as few rounds over the free programs as tiles need
    assert triton.cdiv(len(gemv), free) == rounds
    assert len(gemv) >= rounds * free - max(1, free // 16)  # and the last round almost full (tiles: 303 of 371)


@pytest.mark.parametrize(("tp", "rows"), [(2, 2), (4, 1), (8, 5)])
def test_any_claim_order_the_waits_allow_gives_the_same_bits(weights, tp, rows):
    """Claimed in random topological orders of the table's waits (Runtime.shuffle, the interpreter only), the
    tail gives the table order's bits (dense: tests/kernels/test_dense.py, with a table that must fail; tiny's
    embed has one gather and one reduce, a single order)."""
    k, x, peers = _launch(weights, "tail", tp, rows, grid=3)
    ref = {n: t.clone() for n, t in k(x, peers, poison=True).items()}
    for seed in (1, 2):
        assert k.launch.runtime.shuffle(seed) != list(range(k.launch.table.n_tasks))
        assert _same(ref, k(x, peers, poison=True)), seed


def test_task_table_is_topological_and_boxes_fit_a_line():
    t = TaskTable("test", peers=1)
    producers = [t.add(Hop()) for _ in range(40)]
    c = t.add(EmbedGather(0))
    t.wait(c, producers, "box")
    t.wait_peer(c, 1)
    assert [s.count for s in t.sites if s.kind == BOX] == [32, 8]
    with pytest.raises(AssertionError):
        t.add(Hop())
        t.wait(len(t.tasks) - 1, [len(t.tasks)])
    arrays = t.build("cpu")
    assert arrays["tasks"].numel() == TASK_FIELDS.value * t.n_tasks
    rows = arrays["tasks"].reshape(t.n_tasks, -1).tolist()
    # a row: type, a0-a2, first site, sites, publish flag / box words / first word, first site's kind/index/words
    assert rows[c][:12] == [EMBED_GATHER.value, 0, 0, 0, 0, 3, 0, 0, 40, BOX, 0, 32]
    assert rows[0][:12] == [HOP.value, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]


def test_every_peer_in_one_site():
    """An all-reduce waits on its peers at one site: their consecutive flag words (after the tasks' words),
    polled at once, every peer named as its producer."""
    t = TaskTable("test", peers=3)
    a = t.add(Hop())
    c = t.add(Hop())
    t.wait(c, [a])
    t.wait_peers(c)
    assert [(s.kind, s.count, s.producers) for s in t.sites] == [(FLAG, 1, [a]), (PEER, 3, [-1, -2, -3])]
    assert t.build("cpu")["wait_index"].tolist() == [a, t.n_tasks]
    assert [t.describe_task(p) for p in t.sites[1].producers] == ["peer rank 1", "peer rank 2", "peer rank 3"]


@triton.jit
def _arrive_kernel(word, out, epoch, n):
    from glm53ctl.kernels.runtime.device import arrive_last

    tl.store(out + tl.program_id(0), arrive_last(word, epoch, n).to(tl.int32))


def test_arrive_last_tells_the_last_of_n_per_launch():
    """`arrive_last`: of n arrivals in one launch (epoch) only the last is told it is last; a count an earlier
    launch left (an aborted one's partial count, 2 of 3 here) counts as none in the next epoch: no reset."""
    word = torch.zeros(1, dtype=torch.int32)
    seen = []
    for epoch, arrivals, n in ((1, 3, 3), (2, 2, 3), (3, 3, 3), (4, 1, 1), (5, 24, 24)):
        out = torch.full((arrivals,), -1, dtype=torch.int32)
        _arrive_kernel[(arrivals,)](word, out, epoch, n)  # the interpreter runs the programs one by one
        seen.append(out.tolist())
    assert seen == [[0, 0, 1], [0, 0], [0, 0, 1], [1], [0] * 23 + [1]]
    assert word.item() == (5 << 8) | 24


def test_an_unchecked_fault_does_not_leak_into_the_next_launch(weights):
    """A faulted launch that nobody checked (a graph replay, say): the next launches are clean, and the
    host still hears of the fault when it checks."""
    k, x, peers = _launch(weights, "tail", 2, 2, grid=3)
    clean = k(x, peers, poison=True)
    k(x, peers, stuck_site=0, check=False)
    after = k(x, peers, poison=True, check=False)
    assert _same(clean, after)
    with pytest.raises(LaunchFault) as e:
        k.launch.runtime.check()
    assert e.value.site == 0
    k.launch.runtime.check()  # reported once


def test_build_placeholders_mirror_the_launch_arguments(weights):
    """The ahead-of-time build must see the dtypes the launch passes (tail passes H when it has no peers)."""
    for tp, partial, dtype in ((1, False, torch.bfloat16), (2, False, torch.float32), (2, True, torch.bfloat16)):
        k = make_harness(weights, resolved("tail", tp, 1))
        launch = k.peers[0] if partial else k.launch
        assert launch.placeholder_args()["peers"].logits.dtype == dtype


@pytest.mark.parametrize("kind", ["embed", "tail", "dense", "kda", "sparse"])
@pytest.mark.parametrize("launch", ["persistent", "stages"])
def test_build_placeholders_name_exactly_the_kernels_arguments(kind, launch):
    """What bench's compile step warms up with (tuning/bench.py `_compile`): a stale name is a KeyError there."""
    from glm53ctl.kernels.checks import build_launches

    key = resolved(kind, 2, 1, {"launch": launch}, device=None)
    for name, la in build_launches(load_model("tiny"), key):
        given = set(la.placeholder_args()) | set(la.constexprs())
        assert given == set(la.kernel.arg_names), (name, given ^ set(la.kernel.arg_names))


def test_the_interpreter_spreads_tasks_over_programs(weights):
    """Each program but the last takes its share, so hand-offs cross programs on the CPU as on a GPU: the
    programs that time out at the sites are not all program 0 (tail: tiny's embed has one task per kind)."""
    k, x, peers = _launch(weights, "tail", 2, 2, grid=3, block_n=32)
    programs = set()
    for site in range(len(k.launch.table.sites)):
        with pytest.raises(LaunchFault) as e:
            k(x, peers, stuck_site=site)
        programs.add(e.value.program)
    assert len(programs) > 1, programs


STOCK = pytest.mark.skipif(
    os.environ.get("GLM53CTL_INTERPRETER") == "stock", reason="the interpreter as shipped was asked for"
)


@STOCK
@pytest.mark.parametrize("kind", kernel_kinds())
def test_the_faster_interpreter_gives_the_stock_interpreters_bits(weights, kind):
    """glm53ctl runs Triton's interpreter with its language patched once per launch and the integer-overflow check
    off (kernels/interpreter.py): every kind's launch gives the same bits as the interpreter as shipped."""
    from triton.runtime import interpreter as ti

    from glm53ctl.kernels.interpreter import interpreter_as_shipped

    k = make_harness(weights, resolved(kind, 2, 2))
    assert ti._patch_lang is not ti._glm53ctl_stock[0]  # glm53ctl's settings are in force (the kernels' import)
    x = k.inputs(seed=5)[0]
    peers = k.peer_partials(x)
    fast = k(x, peers, poison=True)
    with interpreter_as_shipped():
        stock = k(x, peers, poison=True)
    assert_same_bits(fast, stock, "the interpreter as shipped")


@triton.jit
def _doubled(p):
    tl.store(p, tl.load(p) * 2)


@STOCK
def test_the_interpreter_as_shipped_is_what_the_test_above_compares_with(monkeypatch):
    """Inside `interpreter_as_shipped` Triton's own patching and overflow check are in force, outside them
    glm53ctl's. As shipped the check is computed and never acted on: an int32 overflow wraps either way, as on
    the GPU, so leaving it off loses nothing. Under TRITON_DEBUG=1 glm53ctl turns it on, and it acts."""
    import triton
    from triton.runtime import interpreter as ti

    from glm53ctl.kernels.interpreter import configure, interpreter_as_shipped

    def doubled():
        x = torch.tensor([2**30 + 1], dtype=torch.int32)
        _doubled[(1,)](x)
        return x.item()

    configure()  # as importing any kernel does (kernels/tlx.py): this test may run before any has been
    assert doubled() == -(2**31) + 2  # wrapped
    with interpreter_as_shipped():
        assert ti._patch_lang is ti._glm53ctl_stock[0] and ti.interpreter_builder.options.sanitize_overflow
        assert doubled() == -(2**31) + 2
    assert ti._patch_lang is not ti._glm53ctl_stock[0] and not ti.interpreter_builder.options.sanitize_overflow
    monkeypatch.setattr(triton.knobs.runtime, "debug", True)  # as TRITON_DEBUG=1 sets it
    configure()
    try:
        with pytest.raises(BaseException, match="overflow"):
            doubled()
    finally:
        monkeypatch.undo()
        configure()
    assert not ti.interpreter_builder.options.sanitize_overflow and doubled() == -(2**31) + 2


def test_the_interpreter_as_shipped_on_request():
    """GLM53CTL_INTERPRETER=stock leaves Triton's interpreter as it comes (a way to rule glm53ctl's settings out)."""
    import subprocess
    import sys

    code = "import glm53ctl.kernels.tlx; from triton.runtime import interpreter as ti; "
    code += "print(hasattr(ti, '_glm53ctl_stock'))"
    env = {k: v for k, v in os.environ.items() if k != "GLM53CTL_INTERPRETER"} | {"TRITON_INTERPRET": "1"}
    said = [
        subprocess.run([sys.executable, "-c", code], env=env | extra, capture_output=True, text=True, check=True).stdout
        for extra in ({}, {"GLM53CTL_INTERPRETER": "stock"})
    ]
    assert said == ["True\n", "False\n"]


def test_every_kernel_module_applies_the_interpreters_settings():
    """A module that defines a kernel imports kernels/tlx.py (itself, or through runtime/device.py, or an op's task
    types through runtime/tasks.py), which applies glm53ctl's settings of the interpreter (kernels/interpreter.py):
    a key runs as fast whichever kind is imported first, and the test above compares what runs."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "kernels"
    imports = ("glm53ctl.kernels import tlx", "glm53ctl.kernels.tlx import", "glm53ctl.kernels.runtime.device import")
    imports += ("glm53ctl.kernels.runtime.tasks import",)
    bare = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p.name != "tlx.py" and "@triton.jit" in (text := p.read_text()) and not any(i in text for i in imports)
    ]
    assert not bare, bare
