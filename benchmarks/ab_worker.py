"""The timing side of benchmarks/ab_trees.py: one tree's launch of one key, timed on request.

Run by ab_trees.py inside a tree's import system (glm53ctl.worktree.finder_code), so `glm53ctl` is that tree's;
the timing code is this checkout's tuning/measure.py, loaded by path (argv[1]), so both trees are timed alike.
Protocol: argv = measure.py, kind, tp, rows; prints "ready <bytes> <copies>", then answers each "round" line on
stdin with the µs per launch of one graph replay (rank 0's launch alone, over rotated copies of the weights it
streams), until "quit".
"""

import importlib.util
import sys

from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import Weights

try:  # this tree's layout, or the one before the kinds registry (git f418783)
    from glm53ctl.kernels.checks import make_harness
except ImportError:
    from glm53ctl.kernels.launches import make_launch as make_harness

spec = importlib.util.spec_from_file_location("ab_measure", sys.argv[1])
measure = importlib.util.module_from_spec(spec)
spec.loader.exec_module(measure)
kind, tp, rows = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

k = make_harness(Weights(load_model("glm53_flash"), seed=0, device="cuda"), kind, tp, rows, {}, "cuda")
x = k.inputs(seed=1)[0].to("cuda")
peers = k.peer_partials(x)
k(x, peers)  # the peers' partials into the launch's buffers; compiles
if kind == "dense":
    conv, S = k.rank_state(x, 0)
    weights = k.w[0]
    launch = lambda w: k.launch(x.H, w, conv, S, check=False)  # noqa: E731
elif kind == "tail":
    weights = {"lm_head": k.shards[0]}
    launch = lambda w: k.launch(x, k.norm, w["lm_head"], peers, check=False)  # noqa: E731
else:
    weights = {"table": k.shards[0]}
    launch = lambda w: k.launch(x, w["table"], peers, check=False)  # noqa: E731
nbytes = sum(t.numel() * t.element_size() for t in weights.values())
n = measure.rotations(nbytes)
copies = [{name: t.clone() for name, t in weights.items()} for _ in range(n)]


def launches() -> None:
    for w in copies:
        launch(w)


timer = measure.graph_timer(launches, inner=10)
print(f"ready {nbytes} {n}", flush=True)
for line in sys.stdin:
    if line.strip() != "round":
        break
    print(timer() / n, flush=True)
