"""Every verdict of `check` and `fault` shown failing: one defect planted in a real launch (the toy kind's kernel
built with it, $GLM53CTL_TOY_DEFECT: tests/toy_kind/__init__.py), the command a user runs, its exit code and the
words of its verdict. Each planted defect is caught by exactly the verdict that exists for it (and, where the
defect also breaks something else, by that too: a NaN is also an unwritten element)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.interpreter


def glm53ctl(*args, defect: str = "", timeout: int = 300) -> tuple[int, dict | None, str]:
    """The CLI in a process of its own, the toy kind registered and `defect` planted: (exit code, the --json
    document, stderr)."""
    env = {
        **os.environ,
        "GLM53CTL_KINDS": "tests.toy_kind",
        "TRITON_INTERPRET": "1",
        "GLM53CTL_TOY_DEFECT": defect,
    }
    cmd = [sys.executable, "-m", "glm53ctl", *map(str, args), "--json"]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        doc = None
    return p.returncode, doc, p.stderr


KEY = ("--kind", "toy", "--tp", "1", "--rows", "4", "-j", "1")


def _problems(doc: dict) -> list[str]:
    (key,) = doc["keys"]
    return key["problems"]


def test_the_toy_without_a_defect_passes_check_and_fault():
    code, doc, err = glm53ctl("check", *KEY)
    assert code == 0 and doc["summary"] == "1 of 1 configs pass", err
    (row,) = doc["keys"]
    assert row["ok"] and row["grids_equal"] and row["repeats_equal"] and all(row["invariants"].values())
    assert row["errors"] == {"y": 0.0, "total": row["errors"]["total"]} and row["errors"]["total"] <= 1e-6
    code, doc, err = glm53ctl("fault", *KEY)
    assert code == 0 and doc["totals"] == {"sites": 4, "named": 4, "hangs": 0, "retries_equal": 4}, err
    (row,) = doc["keys"]
    assert row["ok"] and 0 < row["worst_s"] < 60  # the slowest stuck launch, in seconds


@pytest.mark.parametrize(
    ("defect", "verdicts"),
    [
        # row 0 of y a quarter off: its error over y's bound (0: doubling is exact), and the sums with it
        (
            "accuracy",
            ["y: relative RMS error 0.0689 over its bound 0", "total: relative RMS error 0.557 over its bound"],
        ),
        # a NaN in total: never within a bound, and an element whose poison is left; the same bits every launch
        (
            "nan",
            [
                "total: NaN in the output (relative RMS error inf, its bound 1e-06)",
                "not written (its poison left): total",
            ],
        ),
        # an integer output and a float one never stored: their poison (-1, NaN) left
        ("unwritten", ["total: NaN in the output", "an output element was not written (its poison left): top, total"]),
        # each top a column past its row's largest: the kind's invariant
        ("invariant", ["invariant broken: every top is its row's largest"]),
        # the sum one ulp off at an odd program count: grids 1 and 3 differ from the key's 4, grid 64 does not
        ("grids", ["grid 1 gives other bits than grid 4", "grid 3 gives other bits than grid 4"]),
        # one ulp off in every second launch: the second and fourth launches in a row differ from the first
        ("repeats", ["launch 2 in a row gives other bits", "launch 4 in a row gives other bits"]),
        # the launch leaves its tag where it was
        ("tag", ["the launch tag did not advance once per launch"]),
    ],
)
def test_check_names_each_planted_defect_and_exits_1(defect, verdicts):
    code, doc, err = glm53ctl("check", *KEY, defect=defect)
    assert code == 1, err
    assert doc["summary"] == "0 of 1 configs pass"
    problems = _problems(doc)
    # each verdict said, in order, and nothing else
    assert len(problems) == len(verdicts) and all(v in p for v, p in zip(verdicts, problems, strict=True)), problems
    assert "Error: 0 of 1 configs pass" in err
    # and the row's flags say the same
    (row,) = doc["keys"]
    assert not row["ok"]
    assert row["grids_equal"] == (defect != "grids") and row["repeats_equal"] == (defect != "repeats")
    assert row["schedules_equal"]  # the toy has one schedule
    assert row["invariants"] == {
        "every top is its row's largest": defect != "invariant",
        "every output element written": defect not in ("nan", "unwritten"),
        "tag advanced once per launch": defect != "tag",
    }


@pytest.mark.parametrize(
    ("defect", "verdict", "totals"),
    [
        # the guard not told its site is stuck: the launch runs on, no LaunchFault
        ("silent", "site {s}: no LaunchFault", {"named": 0, "hangs": 0, "retries_equal": 4}),
        # the guard sticks the next site: the fault names another than the one stuck
        ("misnamed", "site {s}: LaunchFault named site {n}", {"named": 0, "hangs": 0, "retries_equal": 4}),
        # a faulted launch leaves a mark the next adds into y
        (
            "scarred",
            "site {s}: the retried launch differs from a clean one",
            {"named": 4, "hangs": 0, "retries_equal": 0},
        ),
        # the launch does not advance its tag: the retry's bits are right, its tag is not
        (
            "tag",
            "site {s}: the retried launch did not advance the launch tag once",
            {"named": 4, "hangs": 0, "retries_equal": 0},
        ),
    ],
)
def test_fault_names_each_planted_defect_and_exits_1(defect, verdict, totals):
    code, doc, err = glm53ctl("fault", *KEY, defect=defect)
    assert code == 1, err
    assert doc["totals"] == {"sites": 4} | totals
    assert _problems(doc) == [verdict.format(s=s, n=(s + 1) % 4) for s in range(4)]
    assert "Error: 4 sites tried" in err


def test_an_unguarded_wait_is_a_hang_reported_within_its_wall_bound_and_its_process_reaped():
    """The sum's wait spins with no budget on its stuck site: the watchdog reports the hang at --wall-s, the
    worker that hung is reaped, the hang is counted in the key's row, and the other key (in a fresh worker) is
    still tested and reported."""
    start = time.monotonic()
    code, doc, err = glm53ctl(
        "fault", "--kind", "toy", "--tp", "1", "--rows", "2,4", "-j", "2", "--wall-s", "4", defect="unguarded"
    )
    took = time.monotonic() - start
    assert code == 1, err
    rows = {k["key"]: k for k in doc["keys"]}
    assert set(rows) == {"tiny/toy/tp1/r2", "tiny/toy/tp1/r4"}
    for name, n in (("tiny/toy/tp1/r2", 2), ("tiny/toy/tp1/r4", 4)):
        r = rows[name]
        assert r["hangs"] == 1 and r["sites"] == 1 and not r["ok"]
        later = "site 1 not tried" if n == 2 else f"sites 1..{n - 1} not tried"
        assert r["problems"] == [f"site 0: the launch did not return within 4 s (a hang); {later}"]
    assert doc["totals"]["hangs"] == 2
    assert "Error: tiny/toy/tp1/r4: site 0 stuck: the launch did not return within 4 s (a hang)" in err
    assert took < 120  # the hangs ended at their bound, not at the test's timeout (the command returned: its
    # workers were killed and reaped, interrupts.kill_workers)


def test_a_site_outside_the_launch_is_refused_before_any_stuck_launch():
    """The library's own guard (the command refuses it first: tests/cli/test_check.py)."""
    from glm53ctl.errors import UsageError
    from glm53ctl.kernels.checks import fault_key
    from glm53ctl.kernels.spec import load_model
    from glm53ctl.kernels.weights import Weights
    from tests.helpers import resolved

    weights = Weights(load_model("tiny"), seed=0)
    key = resolved("embed", 1, 1)
    for site in (-1, 1, 10**6):  # embed at TP1 rows 1 has one site, 0
        with pytest.raises(UsageError, match=rf"^--site {site}: tiny/embed/tp1/r1 has sites 0\.\.0$"):
            fault_key(weights, key, site, 10**6, 60.0)
    res = fault_key(weights, key, 0, 10**6, 60.0)
    assert res.ok and (res.sites, res.named, res.retries_equal, res.hangs) == (1, 1, 1, 0)


def test_a_hang_at_one_site_asked_for_leaves_no_later_site_untried():
    """`--site 1`: the run sticks that site alone, so its hang says nothing of sites not tried."""
    code, doc, err = glm53ctl("fault", *KEY, "--site", "1", "--wall-s", "4", defect="unguarded")
    assert code == 1, err
    assert _problems(doc) == ["site 1: the launch did not return within 4 s (a hang)"]
    assert doc["totals"] == {"sites": 1, "named": 0, "hangs": 1, "retries_equal": 0}


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_command_killed_outright_leaves_no_worker_spinning():
    """`fault` SIGKILLed (no handler runs: a CI job's timeout, the OOM killer) while its worker spins in an unguarded
    wait: the worker dies with it (PR_SET_PDEATHSIG), where before it spun on, a core each, for good."""
    import signal

    env = {
        **os.environ,
        "GLM53CTL_KINDS": "tests.toy_kind",
        "TRITON_INTERPRET": "1",
        "GLM53CTL_TOY_DEFECT": "unguarded",
    }
    cmd = [sys.executable, "-m", "glm53ctl", "fault", *KEY, "--wall-s", "600"]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2:  # the resource tracker and the worker
            time.sleep(0.5)
            workers = _children(p.pid)
        assert workers, "no worker started"
        time.sleep(8)  # the worker in its stuck launch
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(w) for w in workers):
            time.sleep(0.5)
        assert not [w for w in workers if _alive(w)]
    finally:
        p.kill()
        for w in _children(p.pid):
            os.kill(w, signal.SIGKILL)
