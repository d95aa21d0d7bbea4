"""A toy op from outside the tree: the task types the toy kind (tests/toy_kind/) schedules, declared in the op's own
folder as every op in the tree declares its own (kernels/ops/<op>/tasks.py)."""
