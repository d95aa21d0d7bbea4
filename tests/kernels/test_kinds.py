"""The kind registry, the one id space of task types, and task tables that compose into a whole step."""

import importlib
import re
import types
from pathlib import Path

import pytest
import triton
import triton.language as tl

from glm53ctl.errors import UsageError
from glm53ctl.kernels.kinds import KINDS, get_kind, kernel_kinds, load_harness
from glm53ctl.kernels.runtime import tasks
from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.spec import load_model

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "kernels" / "ops"


def _op_task_modules():
    """Every op's tasks.py, imported (each declares its types as it is imported)."""
    return [
        importlib.import_module(f"glm53ctl.kernels.ops.{p.parent.name}.tasks") for p in sorted(OPS.glob("*/tasks.py"))
    ]


def test_task_types_are_one_id_space_with_a_name_each():
    """Every op declares its types in its folder; together they are one id space: ids 0.. with no gap but the
    retired, a name each (a trace or a fault names a type unambiguously), each constant its class's id."""
    modules = _op_task_modules()
    assert {m.__name__.split(".")[-2] for m in modules} == {"dsa", "embed", "ffn", "gemv", "kda", "mhc", "tail"}
    tree = {i: c for i, c in tasks.TYPES.items() if c.__module__.startswith("glm53ctl.")}
    assert sorted([*tree, *tasks.RETIRED]) == list(range(len(tree) + len(tasks.RETIRED)))
    assert len({c.NAME for c in tree.values()}) == len(tree)
    assert tasks.next_id() == len(tree) + len(tasks.RETIRED)
    for m in modules:
        declared = [
            c
            for c in vars(m).values()
            if isinstance(c, type) and issubclass(c, tasks.Task) and c.__module__ == m.__name__
        ]
        consts = {n: v.value for n, v in vars(m).items() if n.isupper() and hasattr(v, "value")}
        assert sorted(consts.values()) == sorted(c.ID for c in declared), m.__name__
    assert tasks.TYPES[2] is tasks.Hop and tasks.Hop().row() == (2, 0, 0, 0)


def test_a_task_is_a_typed_record_that_serializes_into_its_row():
    from glm53ctl.kernels.ops.dsa.tasks import SelectPass

    t = TaskTable("x")
    i = t.add(SelectPass(r=1, step=2, part=3))
    assert t.tasks[i] == (SelectPass.ID, 1, 2, 3) and t.type_name(i) == "index select pass"
    with pytest.raises(AssertionError, match="never reused"):
        types.new_class("Reused", (tasks.Task,), {"id": 25, "name": "x"})
    with pytest.raises(AssertionError, match="task id 35"):
        types.new_class("Twice", (tasks.Task,), {"id": 35, "name": "x"})


@triton.jit
def _unpack_probe(src, out, TYPE: tl.constexpr):
    """Task type TYPE's fields of the row at src, unpacked by `fields` as a layer kernel does, stored in order."""
    row = (tl.load(src), tl.load(src + 1), tl.load(src + 2), tl.load(src + 3))
    N: tl.constexpr = tasks.field_count(TYPE)
    if N == 1:
        tl.store(out, tasks.fields(row, TYPE))
    elif N == 2:
        a, b = tasks.fields(row, TYPE)
        tl.store(out, a)
        tl.store(out + 1, b)
    else:
        a, b, c = tasks.fields(row, TYPE)
        tl.store(out, a)
        tl.store(out + 1, b)
        tl.store(out + 2, c)


def test_each_task_type_is_unpacked_once_by_name():
    """The device code reads a row's fields through `fields(row, TYPE)` alone: each type's fields, as many as its
    record declares, in its order (run in the interpreter); and nothing else reads a row's words by number but
    the runtime's own `row_*` in runtime/device.py."""
    import dataclasses

    import torch

    _op_task_modules()
    for cls in {len(dataclasses.fields(c)): c for c in tasks.TYPES.values() if dataclasses.fields(c)}.values():
        n = len(dataclasses.fields(cls))
        assert tasks.field_count(cls.ID) == n
        src = torch.tensor([cls.ID, 11, 22, 33], dtype=torch.int32)
        out = torch.full((3,), -1, dtype=torch.int32)
        _unpack_probe[(1,)](src, out, cls.ID)
        assert out.tolist() == [11, 22, 33][:n] + [-1] * (3 - n), cls
    reads = []
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\brow\[\d+\]", line) and not (
                path.name == "device.py" and line.startswith("    return row[")
            ):
                reads.append(f"{path.relative_to(ROOT)}:{i}")
    assert reads == [f"kernels/runtime/tasks.py:{i}" for i in _lines_of(ROOT / "kernels/runtime/tasks.py", "row[1]")]


def _lines_of(path: Path, text: str) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]


def test_every_command_reads_the_kinds_from_the_registry():
    assert list(KINDS) == ["embed", "dense", "kda", "sparse", "tail", "model"]
    for name in kernel_kinds():
        k = get_kind(name)
        harness = load_harness(name)
        assert harness.kind == name and k.bounds and harness.STAGES and harness.schedules is not None
    with pytest.raises(UsageError, match="unknown kind 'nope'"):
        get_kind("nope")
    assert "model" not in kernel_kinds() and get_kind("model").composite  # selected by name only
    assert load_harness("model").kind == "model"


def test_tables_compose_into_one_step():
    """embed, two dense layers and the tail in one table: each builder waits on the tasks that produce its
    input and returns those that produce its output; the whole stays in topological order."""
    from glm53ctl.kernels.kinds import get_kind
    from glm53ctl.kernels.kinds.embed.table import add_embed
    from glm53ctl.kernels.kinds.layer.table import Dims, add_dense
    from glm53ctl.kernels.kinds.tail.table import add_tail

    spec, tp, rows = load_model("tiny"), 2, 2
    knobs = get_kind("dense").record(grid=4)
    t = TaskTable("step", peers=tp - 1)
    h = add_embed(t, spec.hidden, 64, tp, "box", partial_only=False)
    parts = [(len(t.tasks), h)]  # (the part's first task, the tasks its input comes from)
    for _ in range(2):
        h = add_dense(t, Dims(spec, tp, knobs), rows, knobs, after=h)
        parts.append((len(t.tasks), h))
    logits = add_tail(t, rows, spec.shards(tp).vocab, tp, 64, "box", fold=True, after=h)
    assert logits and max(logits) == t.n_tasks - 1
    for s in t.sites:
        assert all(p < s.task for p in s.producers)
    # each part's first task waits on exactly the tasks that made its input
    for start, made_input in parts:
        assert {p for s in t.sites_of(start) if s.producers[0] >= 0 for p in s.producers} == set(made_input)
    # and no task of a part reads H before those tasks: the tail's folded lm_head waits on them early
    lm_head = next(i for i in logits if t.type_name(i) == "lm_head")
    early = {p for s in t.sites_of(lm_head) if not s.late for p in s.producers}
    assert early == set(parts[-1][1])
    built = t.build("cpu")
    assert built["tasks"].numel() == 16 * t.n_tasks
