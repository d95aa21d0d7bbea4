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


def hold(owner, attr: str, folder: Path, workers: int = 2, timeout: float = 3.0) -> None:
    """Make `owner.attr` (a function) wait, on its first call, until `workers` processes sharing `folder` have
    all called it (or `timeout` s passed): the moment where two workers race, made certain."""
    real = getattr(owner, attr)
    first = [True]

    def held(*args, **kwargs):
        if first[0]:
            first[0] = False
            (folder / str(os.getpid())).touch()
            deadline = time.monotonic() + timeout
            while len(os.listdir(folder)) < workers and time.monotonic() < deadline:
                time.sleep(0.001)
        return real(*args, **kwargs)

    setattr(owner, attr, held)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("storage")
    p.add_argument("name")
    p.add_argument("trials", type=int)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--go", help="wait until this file exists before searching (to start workers together)")
    p.add_argument(
        "--hold-enqueue",
        help="a folder shared with one other worker: on enqueueing a trial, wait (up to 3 s) until the other "
        "worker enqueues one too (both found the study empty)",
    )
    p.add_argument(
        "--hold-schema",
        help="a folder shared with one other worker: before creating the database's tables (SQLAlchemy's "
        "MetaData.create_all), wait (up to 3 s) until the other worker gets there too",
    )
    args = p.parse_args()
    if args.hold_enqueue:
        import optuna

        hold(optuna.study.Study, "enqueue_trial", Path(args.hold_enqueue))
    if args.hold_schema:
        import sqlalchemy

        hold(sqlalchemy.MetaData, "create_all", Path(args.hold_schema))

    ev = SyntheticEvaluator(true_us, seed=args.seed, sleep=args.sleep)
    print(f"READY {os.getpid()}", flush=True)
    if args.go:
        while not os.path.exists(args.go):
            time.sleep(0.002)
    storage = storage_of(args.storage)

    def on_trial(study, trial) -> None:
        print(f"TRIAL {trial.number} {trial.state.name}", flush=True)

    search(ev, DEFAULT, SPACE, storage, args.name, args.trials, seed=args.seed, samples=args.samples, on_trial=on_trial)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
