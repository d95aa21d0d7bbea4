"""This tree against another one on one GPU (`glm53ctl bench --against REF`): each tree's launch of a key in a
process of its own, that tree's own tuning/bench_worker.py, spoken to in a versioned protocol (that file's
docstring); both timed by this checkout's tuning/measure.py, in alternating rounds; a same-against-same run of
this tree first sets the noise threshold δ. A REF whose worker speaks no version this parent speaks is refused
with what to do (`WorkerRefused`, exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from glm53ctl.errors import Glm53Error
from glm53ctl.tuning import measure
from glm53ctl.worktree import finder_code, this_tree

HERE = Path(__file__).resolve().parent
MEASURE = HERE / "measure.py"  # the timing code both trees' workers load: this checkout's
PROTOCOL = "glm53ctl-bench"
SPEAKS = (1,)  # the versions of tuning/bench_worker.py's protocol (its docstring) this parent speaks


class WorkerRefused(Glm53Error):
    """A tree's bench worker speaks no version of the protocol that this glm53ctl speaks (exit 2)."""


class _Stderr(threading.Thread):
    """A worker's stderr, passed on to this process's once its hello is heard: a worker this parent refuses
    (one from before the protocol fails on the argv it is not given) leaves no traceback of its own."""

    def __init__(self, pipe) -> None:
        super().__init__(daemon=True)
        self.pipe, self.held, self.lock = pipe, [], threading.Lock()
        self.start()

    def run(self) -> None:
        for line in self.pipe:
            with self.lock:
                if self.held is None:
                    sys.stderr.write(line)
                    sys.stderr.flush()
                else:
                    self.held.append(line)

    def pass_on(self) -> None:
        with self.lock:
            sys.stderr.write("".join(self.held or []))
            sys.stderr.flush()
            self.held = None


class Worker:
    """A tree's own timing process (its tuning/bench_worker.py), in the protocol that file sets out: its hello
    checked here, `set_up` one key, then each call is the µs per launch of one graph replay."""

    def __init__(self, tree: Path) -> None:

        self.tree = tree
        worker = tree / "tuning" / "bench_worker.py"
        if not worker.is_file():
            raise self._refused("no bench worker (tuning/bench_worker.py): it is too old", older=True)
        code = finder_code(tree) + worker.read_text()
        self.p = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr = _Stderr(self.p.stderr)
        line = self.p.stdout.readline()
        hello = line.split()
        ours = hello[:2] == ["hello", PROTOCOL] and len(hello) == 3 and hello[2].isdigit()
        self.version = int(hello[2]) if ours else None
        if self.version in SPEAKS:
            self.stderr.pass_on()
            return
        self._stop()
        if not hello:
            self.stderr.pass_on()
            raise Glm53Error(f"{tree}: its bench worker exited before its hello (see above)")
        if hello[0] != "hello":  # from before the protocol: it took the key as argv and says `ready` or `error` first
            raise self._refused(
                "its bench worker is too old: it says no hello (it predates the versioned protocol)", True
            )
        if self.version is None:
            raise self._refused(f"its bench worker speaks another protocol: its hello is {line.strip()[:60]!r}", False)
        older = self.version < min(SPEAKS)
        raise self._refused(
            f"its bench worker is too {'old' if older else 'new'}: it speaks {PROTOCOL} {self.version}", older
        )

    def _refused(self, what: str, older: bool) -> WorkerRefused:

        # a bench from before the protocol runs its own worker for both trees, over each tree's library: an older
        # tree's bench drives this tree's kernels (through kernels/checks.py's make_harness)
        run = f"run bench from a checkout of that ref with --against {this_tree()}"
        hint = f"{run}: an older tree's bench drives a newer tree's kernels"
        if not older:
            hint = f"update this checkout, or {run} (if its bench still speaks {PROTOCOL} {max(SPEAKS)})"
        speaks = ", ".join(str(v) for v in SPEAKS)
        return WorkerRefused(f"{self.tree}: {what}; this glm53ctl speaks {PROTOCOL} {speaks}", hint)

    def _stop(self) -> None:
        """Ends a worker that is not spoken to further: its stdin closed, it exits (one that hangs is killed)."""
        self.p.stdin.close()
        try:
            self.p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.stderr.join()  # all it wrote is out, before the error that says "see above"

    def set_up(self, model: str, kind: str, tp: int, rows: int, knobs: dict, seed: int, context=None) -> Worker:
        """Sends the key; back when the worker has it set up, compiled and captured (or says why it cannot)."""
        key = {"measure": str(MEASURE), "model": model, "kind": kind, "tp": tp, "rows": rows, "knobs": knobs}
        self.p.stdin.write(f"key {json.dumps(key | {'seed': seed, 'context': context})}\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        ready = line.split(maxsplit=3)
        if not ready or ready[0] != "ready":
            self._stop()  # it is exiting: its traceback is out
            why = line.split(maxsplit=1)[1].strip() if ready and ready[0] == "error" else "it exited (see above)"
            at = "" if context is None else f" at context {context}"
            raise Glm53Error(f"{self.tree}: cannot time {kind} TP{tp} rows {rows}{at}: {why}")
        self.nbytes, self.copies, self.knobs = int(ready[1]), int(ready[2]), json.loads(ready[3])
        return self

    def __call__(self) -> float:
        self.p.stdin.write("round\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        try:
            return float(line)
        except ValueError:
            self._stop()
            why = line.split(maxsplit=1)[1].strip() if line.startswith("error ") else "it exited (see above)"
            raise Glm53Error(f"{self.tree}: its bench worker stopped mid-run: {why}") from None

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
            self.p.wait()
        self.stderr.join()


def against(
    this: Path, ref: Path, model: str, kind: str, tp: int, rows: int, knobs: dict, seed: int, rounds: int, context=None
):
    """This tree (A) and REF (B) on one key: the same-against-same run of this tree, δ, and this / REF (below 1:
    this tree is faster) with its interval and the verdict for this tree."""
    # REF's worker first: one whose protocol this glm53ctl does not speak is refused before any key is set up
    b = Worker(ref)
    try:
        a = Worker(this)
        try:
            a.set_up(model, kind, tp, rows, knobs, seed, context)
            b.set_up(model, kind, tp, rows, knobs, seed, context)
            for _ in range(5):  # clocks and caches settle
                a(), b()
            same = measure.ratio(*measure.ab_rounds(a, a, rounds))
            delta = measure.keep_threshold(measure.spread(same))
            # B/A with A = REF, B = this: below 1, this tree is faster
            vs = measure.ratio(*measure.ab_rounds(b, a, rounds))
        finally:
            a.close()
    finally:
        b.close()
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
