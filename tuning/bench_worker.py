"""One tree's launch of one key, timed on request: the other side of `glm53ctl bench --against` (tuning/ab.py).

Run as `python -c <finder code of TREE> + this file's text`, so `glm53ctl` is TREE's (its kernels, its knobs and
tuned files), while the timing code is the running checkout's tuning/measure.py, loaded by path: both trees are
timed alike, and never imported into one interpreter (docs/design.md §7).

argv: measure.py path, model, kind, tp, rows, knobs (JSON), seed[, context]. Prints
`ready <bytes> <copies> <knobs JSON>`, then answers each `round` line on stdin with the µs per launch of one
graph replay, until `quit`; or, when the key cannot be set up in this tree, `error <why>` (one line) and exits.
"""

import importlib.util
import json
import math
import sys


def _say_why(kind_, e, tb) -> None:
    """Whatever stops this worker before it is ready: its traceback on stderr, then why on the parent's line."""
    sys.__excepthook__(kind_, e, tb)
    sys.stderr.flush()
    print("error", f"{kind_.__name__}: {e}".replace("\n", " "), flush=True)


sys.excepthook = _say_why

import torch  # noqa: E402

from glm53ctl.kernels.spec import load_model  # noqa: E402
from glm53ctl.kernels.weights import Weights  # noqa: E402

try:  # a tree with the kind registry; before it (git f418783), the launches module
    from glm53ctl.kernels.checks import make_harness
except ImportError:
    from glm53ctl.kernels.launches import make_launch as make_harness

spec_ = importlib.util.spec_from_file_location("bench_measure", sys.argv[1])
measure = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(measure)
model, kind, tp, rows = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
knobs, seed = json.loads(sys.argv[6]), int(sys.argv[7])
context = {"context": int(sys.argv[8])} if len(sys.argv) > 8 else {}


def set_up():
    try:
        return make_harness(Weights(load_model(model), seed=0, device="cuda"), kind, tp, rows, knobs, "cuda", **context)
    except TypeError as e:
        if context and "unexpected keyword argument 'context'" in str(e):  # a tree from before git 06ceb1a
            raise RuntimeError(f"its {kind} takes no context (the tree predates --context): {e}") from e
        raise


k = set_up()
x = k.inputs(seed=seed)[0]
peers = k.peer_partials(x)
k(x, peers)  # compiles; the peers' partials in place

if hasattr(k, "timed"):
    t = k.timed(x, peers)
    call, stream_bytes, nbytes = t.call, t.stream_bytes, t.nbytes
    copies = t.copies(measure.rotations(stream_bytes))
else:  # a tree from before `timed` (git f418783 and its time): its launches, rotating the weights they stream
    x = x.to("cuda")

    def legacy_dense():
        conv, S = k.rank_state(x, 0)
        return k.w[0], lambda w: k.launch(x.H, w, conv, S, check=False)

    LEGACY = {
        "dense": legacy_dense,
        "tail": lambda: ({"lm_head": k.shards[0]}, lambda w: k.launch(x, k.norm, w["lm_head"], peers, check=False)),
        "embed": lambda: ({"table": k.shards[0]}, lambda w: k.launch(x, w["table"], peers, check=False)),
    }
    first, call = LEGACY[kind]()
    stream_bytes = nbytes = sum(v.numel() * v.element_size() for v in first.values())
    n = measure.rotations(stream_bytes)
    copies = [first] + [{name: v.clone() for name, v in first.items()} for _ in range(n - 1)]


def launches() -> None:
    for c in copies:
        call(c)


replay = measure.graph_timer(launches, inner=max(1, math.ceil(40 / len(copies))))
print(f"ready {nbytes} {len(copies)} {json.dumps(k.knobs)}", flush=True)
sys.excepthook = sys.__excepthook__
for line in sys.stdin:
    if line.strip() != "round":
        break
    print(replay() / len(copies), flush=True)
torch.cuda.synchronize()
