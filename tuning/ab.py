"""This tree against another one on one GPU (`glm53ctl bench --against REF`): each tree's launch of a key in a
process of its own (tuning/bench_worker.py), both timed by this checkout's tuning/measure.py, in alternating
rounds; a same-against-same run of this tree first sets the noise threshold δ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from glm53ctl.errors import Glm53Error
from glm53ctl.tuning import measure

HERE = Path(__file__).resolve().parent


class Worker:
    """A tree's timing process for one key: each call is the µs per launch of one graph replay."""

    def __init__(
        self, tree: Path, model: str, kind: str, tp: int, rows: int, knobs: dict, seed: int, context=None
    ) -> None:
        from glm53ctl.worktree import finder_code

        code = finder_code(tree) + (HERE / "bench_worker.py").read_text()
        args = [sys.executable, "-c", code, str(HERE / "measure.py"), model, kind, str(tp), str(rows)]
        args += [json.dumps(knobs), str(seed)] + ([str(context)] if context is not None else [])
        self.tree = tree
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        ready = line.split(maxsplit=3)
        if not ready or ready[0] != "ready":
            try:  # it is exiting: its traceback is out; one that hangs instead is stopped
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
            why = line.split(maxsplit=1)[1].strip() if ready and ready[0] == "error" else "it exited (see above)"
            at = "" if context is None else f" at context {context}"
            raise Glm53Error(f"{tree}: cannot time {kind} TP{tp} rows {rows}{at}: {why}")
        self.nbytes, self.copies, self.knobs = int(ready[1]), int(ready[2]), json.loads(ready[3])

    def __call__(self) -> float:
        self.p.stdin.write("round\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline())

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait()


def against(
    this: Path, ref: Path, model: str, kind: str, tp: int, rows: int, knobs: dict, seed: int, rounds: int, context=None
):
    """This tree (A) and REF (B) on one key: the same-against-same run of this tree, δ, and this / REF (below 1:
    this tree is faster) with its interval and the verdict for this tree."""
    a = Worker(this, model, kind, tp, rows, knobs, seed, context)
    try:
        b = Worker(ref, model, kind, tp, rows, knobs, seed, context)
        try:
            for _ in range(5):  # clocks and caches settle
                a(), b()
            same = measure.ratio(*measure.ab_rounds(a, a, rounds))
            delta = measure.keep_threshold(measure.spread(same))
            # B/A with A = REF, B = this: below 1, this tree is faster
            vs = measure.ratio(*measure.ab_rounds(b, a, rounds))
        finally:
            b.close()
    finally:
        a.close()
    return {
        "this_us": vs["b_us"],
        "ref_us": vs["a_us"],
        "ratio": vs["ratio"],
        "ratio_ci": vs["ratio_ci"],
        "same": {"ratio": same["ratio"], "ratio_ci": same["ratio_ci"]},
        "delta": delta,
        "verdict": measure.verdict(vs["ratio_ci"], delta),
        "this_knobs": a.knobs,
        "ref_knobs": b.knobs,
        "bytes": a.nbytes,
    }
