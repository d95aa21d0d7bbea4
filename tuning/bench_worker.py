"""One tree's launch of one key, timed on request: the other side of `glm53ctl bench --against` (tuning/ab.py).

Each tree ships its own worker: the parent runs TREE's copy of this file as `python -c <finder code of TREE> +
its text`, so `glm53ctl` is TREE's (its kernels, its knobs and tuned files), while the timing code is the
parent's tuning/measure.py, loaded by path: both trees are timed alike, and never imported into one interpreter
(docs/design.md §7).

The protocol, `glm53ctl-bench` version 1: lines of text, one at a time each way, in this order.

    worker  hello glm53ctl-bench 1               first, before anything that can fail; to a version it does not
                                                 speak, the parent answers by closing stdin (the worker exits)
    parent  key <JSON>                           {"measure": the timing code's path, "model", "kind", "tp",
                                                 "rows", "knobs" (the overrides), "seed", "context" (or null)}
    worker  ready <bytes> <copies> <knobs JSON>  the key set up, compiled and captured; the knobs in force
    parent  round                                as many as it likes, each answered by
    worker  <µs>                                 the µs per launch of one graph replay
    parent  quit                                 (or stdin closed): the worker exits
    worker  error <why>                          in place of any answer: what stopped it (its traceback is on
                                                 stderr), and it exits

A worker from before the protocol says no hello (its first line is `ready` or `error`; it took the key as argv).
The version changes with any change a parent of the last version would misread (a line, a field of the key);
tuning/ab.py's `SPEAKS` lists the versions a parent speaks. Only these lines go to stdout: anything else written
there (a library's print, a compiler's) goes to stderr.
"""

import json
import math
import os
import sys

PROTOCOL, VERSION = "glm53ctl-bench", 1

_out = os.fdopen(os.dup(1), "w")  # the protocol's own stdout
os.dup2(2, 1)  # the rest of this process's stdout goes to stderr, out of the protocol's way


def say(*words) -> None:
    print(*words, file=_out, flush=True)


def _say_why(kind_, e, tb) -> None:
    """Whatever stops this worker: its traceback on stderr, then why on the parent's line."""
    sys.__excepthook__(kind_, e, tb)
    sys.stderr.flush()
    say("error", f"{kind_.__name__}: {e}".replace("\n", " "))


say("hello", PROTOCOL, VERSION)
sys.excepthook = _say_why
line = sys.stdin.readline()
if not line.startswith("key "):
    sys.exit(0)  # the parent speaks no version of ours (it says so) or stops before a key
key = json.loads(line.split(maxsplit=1)[1])

import importlib.util  # noqa: E402

import torch  # noqa: E402

from glm53ctl.kernels.checks import make_harness  # noqa: E402
from glm53ctl.kernels.spec import load_model  # noqa: E402
from glm53ctl.kernels.weights import Weights  # noqa: E402
from glm53ctl.tuning.knobs import resolve_key  # noqa: E402

spec_ = importlib.util.spec_from_file_location("bench_measure", key["measure"])
measure = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(measure)
weights = Weights(load_model(key["model"]), seed=0, device="cuda")
# this side's command boundary: the key resolved once in this tree (its defaults and tuned files), its warnings said
resolved = resolve_key(key["model"], key["kind"], key["tp"], key["rows"], key["knobs"], "cuda", key["context"])
for w in resolved.warnings:
    print(f"Warning: {w}", file=sys.stderr)
k = make_harness(weights, resolved)
x = k.inputs(seed=key["seed"])[0]
peers = k.peer_partials(x)
k(x, peers)  # compiles; the peers' partials in place
t = k.timed(x, peers)
copies = t.copies(measure.rotations(t.stream_bytes))


def launches() -> None:
    for c in copies:
        t.call(c)


replay = measure.graph_timer(launches, inner=max(1, math.ceil(40 / len(copies))))
say("ready", t.nbytes, len(copies), json.dumps(dict(k.knobs)))
for line in sys.stdin:
    if line.strip() != "round":
        break
    say(replay() / len(copies))
if torch.cuda.is_initialized():
    torch.cuda.synchronize()
