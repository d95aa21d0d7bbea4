"""A kind's launch in this tree against another tree's, on one GPU, in alternating rounds (issue 16's check that
the restructure costs no speed; `glm53ctl bench --against` will do this for every kind).

    python3 benchmarks/ab_trees.py OUT REF_TREE [KIND:TP:ROWS ...]      (default dense:4:1 dense:8:1)

Each tree's launch of a key runs in a process of its own (benchmarks/ab_worker.py, never two trees in one
interpreter), timed by this checkout's tuning/measure.py: a CUDA graph of launches over rotated weight copies,
µs per launch per replay. Per key: a same-against-same run of this tree (its spread sets δ), then this tree (A)
against REF (B) in A B B A rounds: the median ratio REF / this with its bootstrap interval and the verdict.
Writes OUT/ab.json (with the environment record) and prints a table.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))


class Worker:
    """A tree's timing process for one key."""

    def __init__(self, tree: Path, kind: str, tp: int, rows: int) -> None:
        from glm53ctl.worktree import finder_code

        code = finder_code(tree) + (HERE / "ab_worker.py").read_text()
        args = [sys.executable, "-c", code, str(ROOT / "tuning" / "measure.py"), kind, str(tp), str(rows)]
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.p.stdout.readline().split()
        assert ready and ready[0] == "ready", f"{tree}: the worker did not start"
        self.nbytes, self.copies = int(ready[1]), int(ready[2])

    def __call__(self) -> float:
        self.p.stdin.write("round\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.write("quit\n")
        self.p.stdin.close()
        self.p.wait()


def main(out: Path, ref: Path, keys: list[tuple[str, int, int]], rounds: int = 25) -> None:
    from glm53ctl.tuning import measure

    out.mkdir(parents=True, exist_ok=True)
    measure.warm_clocks()
    bw = measure.copy_bandwidth()
    results = []
    for kind, tp, rows in keys:
        a, b = Worker(ROOT, kind, tp, rows), Worker(ref, kind, tp, rows)
        for _ in range(5):  # clocks and caches settle
            a(), b()
        same = measure.ratio(*measure.ab_rounds(a, a, rounds))
        delta = measure.keep_threshold(measure.spread(same))
        vs = measure.ratio(*measure.ab_rounds(a, b, rounds))
        row = {
            "kind": kind,
            "tp": tp,
            "rows": rows,
            "weight_bytes": a.nbytes,
            "copies": a.copies,
            "same": same,
            "delta": delta,
        }
        row |= {"ref_vs_this": vs, "verdict_for_ref": measure.verdict(vs["ratio_ci"], delta)}
        row["floor_us"] = measure.floor_us(a.nbytes, bw)
        results.append(row)
        a.close(), b.close()
        print(
            f"{kind} TP{tp} r{rows}: this {vs['a_us']:.1f} us, ref {vs['b_us']:.1f} us, ref/this {vs['ratio']:.4f} "
            f"[{vs['ratio_ci'][0]:.4f}, {vs['ratio_ci'][1]:.4f}], delta {delta:.3f}: ref {row['verdict_for_ref']}",
            flush=True,
        )
    doc = {"environment": measure.environment(" ".join(["python3", *sys.argv])), "code_digest": measure.code_digest()}
    doc |= {"copy_tb_s": bw, "ref": str(ref), "rounds": rounds, "keys": results}
    (out / "ab.json").write_text(json.dumps(doc, indent=2) + "\n")
    print("| key | this tree µs | ref µs | ref / this (95% CI) | δ | verdict |")
    for r in results:
        v = r["ref_vs_this"]
        print(
            f"| {r['kind']} TP{r['tp']} r{r['rows']} | {v['a_us']:.1f} | {v['b_us']:.1f} | {v['ratio']:.4f} "
            f"({v['ratio_ci'][0]:.4f}-{v['ratio_ci'][1]:.4f}) | {r['delta']:.3f} | ref {r['verdict_for_ref']} |"
        )


if __name__ == "__main__":
    specs = [a.split(":") for a in sys.argv[3:]] or [["dense", "4", "1"], ["dense", "8", "1"]]
    main(Path(sys.argv[1]), Path(sys.argv[2]).resolve(), [(k, int(t), int(r)) for k, t, r in specs])
