"""The timing side of benchmarks/ab_trees.py: one tree's `dense` launch of one key, timed on request.

Run by ab_trees.py inside a tree's import system (glm53ctl.worktree.finder_code), so `glm53ctl` is that tree's;
the timing code is this checkout's tuning/measure.py, loaded by path (argv[1]), so both trees are timed alike.
Protocol: argv = measure.py, tp, rows; prints "ready <bytes> <copies>", then answers each "round" line on stdin
with the µs per launch of one graph replay, until "quit".
"""

import importlib.util
import sys

from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights

try:  # this tree's layout, or the one before the kinds registry (git f418783)
    from glm53ctl.kernels.kinds.dense.harness import DenseHarness as DenseKind
except ImportError:
    from glm53ctl.kernels.launches import DenseKind

spec = importlib.util.spec_from_file_location("ab_measure", sys.argv[1])
measure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(measure)
tp, rows = int(sys.argv[2]), int(sys.argv[3])

k = DenseKind(Weights(load_model("glm53_flash"), seed=0, device="cuda"), tp, rows, {}, "cuda")
x = k.inputs(seed=1)[0].to("cuda")
k(x, k.peer_partials(x))  # the peers' partials into the launch's buffers; compiles
conv, S = k.rank_state(x, 0)
nbytes = sum(t.numel() * t.element_size() for t in k.w[0].values())
n = measure.rotations(nbytes)
copies = [{name: t.clone() for name, t in k.w[0].items()} for _ in range(n)]


def launches() -> None:
    for w in copies:
        k.launch(x.H, w, conv, S, check=False)


timer = measure.graph_timer(launches, inner=10)
print(f"ready {nbytes} {n}", flush=True)
for line in sys.stdin:
    if line.strip() != "round":
        break
    print(timer() / n, flush=True)
