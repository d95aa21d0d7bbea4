"""Nsight Compute's view of one `dense` launch (issue 7: where a KDA part's time goes).

On the GPU machine:  python3 benchmarks/ncu_dense.py OUT [TP ROWS]
Runs ncu on rank 0's 4th launch of the persistent kernel (warp-state sampling per SASS instruction), writes the
report and its source page as CSV to OUT, and prints the instructions with the most stall samples.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path


def launches(tp: int, rows: int, n: int = 4) -> None:
    """n launches of dense at glm53_flash per-rank sizes (the profiled process)."""
    import torch

    from glm53ctl.kernels.kinds.dense.harness import DenseHarness
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights

    k = DenseHarness(Weights(load_model("glm53_flash"), seed=0, device="cuda"), tp, rows, {}, "cuda")
    x = k.inputs(seed=1)[0].to("cuda")
    peers = k.peer_partials(x)
    for _ in range(n):
        k(x, peers)
    torch.cuda.synchronize()


def main(out: Path, tp: int, rows: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rep = out / f"dense-tp{tp}-r{rows}"
    skip = (2 * tp - 1 if tp > 1 else 0) + 3  # the peers' partial launches (attn: tp, ffn: tp - 1), 3 warm-ups
    ncu = ["ncu", "--kernel-name", "dense_kernel", "--launch-skip", str(skip), "--launch-count", "1"]
    ncu += ["--section", "SourceCounters", "--section", "WarpStateStats", "--section", "SpeedOfLight"]
    ncu += ["-f", "-o", str(rep), sys.executable, __file__, "--launch", str(tp), str(rows)]
    subprocess.run(ncu, check=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    page = subprocess.run(
        ["ncu", "--import", f"{rep}.ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (out / f"dense-tp{tp}-r{rows}-sass.csv").write_text(page)
    # the page: a "Kernel Name" line, then a CSV of one row per SASS instruction
    rows_ = list(csv.DictReader(line for line in page.splitlines()[1:] if line.startswith('"')))
    key = "Warp Stall Sampling (All Samples)"
    for r in sorted(rows_, key=lambda r: -float(r.get(key) or 0))[:60]:
        print(r.get(key), r.get("Address", ""), r.get("Source", "").strip()[:110])
    details = subprocess.run(["ncu", "--import", f"{rep}.ncu-rep", "--page", "details"], capture_output=True, text=True)
    (out / f"dense-tp{tp}-r{rows}-details.txt").write_text(details.stdout)
    print(details.stdout[-3000:])


if __name__ == "__main__":
    if sys.argv[1] == "--launch":
        launches(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main(Path(sys.argv[1]), *(int(v) for v in (sys.argv[2:4] or ("8", "1"))))
