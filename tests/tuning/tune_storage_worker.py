"""A worker process for tests/tuning/test_tune_storage.py: runs `tune.search` on one study in real storage with
a synthetic evaluator, and prints one line per trial it finished ("TRIAL <number> <state>")."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from glm53ctl.tuning.tune import search, storage_of  # noqa: E402
from tests.tuning.synthetic import SyntheticEvaluator  # noqa: E402

SPACE = {"a": (0, 1, 2), "b": (0, 1, 2), "c": (0, 1, 2)}
DEFAULT = {"a": 1, "b": 1, "c": 1}


def true_us(knobs: dict) -> float:
    return 50.0 + 3 * knobs["a"] + 2 * knobs["b"] - 4 * knobs["c"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("storage")
    p.add_argument("name")
    p.add_argument("trials", type=int)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--go", help="wait until this file exists before searching (to start workers together)")
    args = p.parse_args()

    storage = storage_of(args.storage)
    ev = SyntheticEvaluator(true_us, seed=args.seed, sleep=args.sleep)
    print(f"READY {os.getpid()}", flush=True)
    if args.go:
        while not os.path.exists(args.go):
            time.sleep(0.005)

    def on_trial(study, trial) -> None:
        print(f"TRIAL {trial.number} {trial.state.name}", flush=True)

    search(ev, DEFAULT, SPACE, storage, args.name, args.trials, seed=args.seed, samples=args.samples, on_trial=on_trial)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
