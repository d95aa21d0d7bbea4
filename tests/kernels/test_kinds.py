"""The kind registry, the one id space of task types, and task tables that compose into a whole step."""

import pytest

from glm53ctl.errors import UsageError
from glm53ctl.kernels.kinds import KINDS, get_kind, kernel_kinds, load_harness
from glm53ctl.kernels.runtime import task_types
from glm53ctl.kernels.runtime.table import TaskTable
from glm53ctl.kernels.spec import load_model


def test_task_types_are_one_id_space_with_a_name_each():
    consts = {n: v for n, v in vars(task_types).items() if n.isupper() and n != "TYPE_NAMES" and not n.startswith("_")}
    ids = [c.value for c in consts.values()]
    assert sorted(ids) == list(range(len(ids))) == sorted(task_types.TYPE_NAMES)
    assert len(set(task_types.TYPE_NAMES.values())) == len(ids)  # a trace or a fault names a type unambiguously
    assert [n for n, _ in task_types._TYPES] == [n for n, c in sorted(consts.items(), key=lambda kv: kv[1].value)]


def test_every_command_reads_the_kinds_from_the_registry():
    assert list(KINDS) == ["embed", "dense", "kda", "sparse", "tail", "model"]
    for name in kernel_kinds():
        k = get_kind(name)
        harness = load_harness(name)
        assert harness.kind == name and k.bounds and harness.STAGES
    with pytest.raises(UsageError, match="unknown kind 'nope'"):
        get_kind("nope")
    assert "model" not in kernel_kinds() and get_kind("model").composite  # selected by name only
    assert load_harness("model").kind == "model"


def test_tables_compose_into_one_step():
    """embed, two dense layers and the tail in one table: each builder waits on the tasks that produce its
    input and returns those that produce its output; the whole stays in topological order."""
    from glm53ctl.kernels.kinds.embed.table import add_embed
    from glm53ctl.kernels.kinds.layer.table import Dims, add_dense
    from glm53ctl.kernels.kinds.tail.table import add_tail
    from glm53ctl.tuning.knobs import defaults

    spec, tp, rows = load_model("tiny"), 2, 2
    knobs = {**defaults("dense"), "grid": 4}
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
