import functools
import subprocess
import sys
from pathlib import Path

import pytest

from glm53ctl import __version__
from tests.helpers import invoke


def test_version(capsys):
    code, out, _ = invoke(capsys, "--version")
    assert code == 0 and out.strip() == f"glm53ctl {__version__}"


@pytest.mark.parametrize("args", [["-h"], ["--help"], ["configs", "-h"]])
def test_help(capsys, args):
    code, out, _ = invoke(capsys, *args)
    assert code == 0 and "Usage" in out


@pytest.mark.parametrize("args", [[], ["configs"]])
def test_a_bare_group_shows_its_usage_and_says_what_is_missing(capsys, args):
    """Before: `glm53ctl` alone printed its usage on stdout and no `Error:` line (issue 45)."""
    code, out, err = invoke(capsys, *args)
    assert code == 2 and out == ""
    assert "Usage: glm53ctl" in err and "Error: missing a command" in err


def test_every_command_group_is_registered():
    """Typer's own command list, not substrings of the help text (where "run" is in "runs"): each command its
    module's, named as listed, and its line in `glm53ctl -h` its own help's first sentence."""
    import typer

    from glm53ctl.cli import COMMANDS, app

    group = typer.main.get_command(app)
    names = group.list_commands(None)
    assert sorted(names) == ["bench", "build", "check", "compare", "configs", "fault", "prune", "report", "run", "tune"]
    for name in names:
        command = group.get_command(None, name)
        assert command.name == name and command.get_short_help_str(1000) == COMMANDS[name][1]
    assert sorted(group.get_command(None, "configs").commands) == ["diff", "migrate", "show", "validate"]
    assert group.get_command(None, "nonesuch") is None


def test_the_help_and_a_mistyped_command_load_no_command_module():
    p = _run(
        "import sys",
        "from glm53ctl.cli import run_cli",
        "codes = [run_cli(['--help']), run_cli(['--version']), run_cli(['chekc'])]",
        "print(codes, sorted(m for m in sys.modules if m.startswith('glm53ctl.commands.')))",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith("[0, 0, 2] []"), p.stdout


@pytest.mark.parametrize("name", ["bench", "tune"])
def test_timing_commands_need_a_gpu(capsys, name, monkeypatch):
    """No GPU: exit 2 with one Error: and a Hint:, after the options are checked, before anything is built."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    code, out, err = invoke(capsys, name, "--tp", "4", "--rows", "2", "--kind", "dense")
    assert code == 2 and out == ""
    lines = [l for l in err.splitlines() if l.strip()]
    assert lines[0].startswith("Error:") and "needs a CUDA GPU" in lines[0] and lines[1].startswith("Hint:")


@pytest.mark.parametrize(
    "args, says",
    [
        (["bench", "--tp", "3"], "--tp '3'"),
        (["bench", "--kind", "dense", "--knobs", "oproj_first=2"], "oproj_first='2'"),
        (["bench", "--kind", "dense", "--knobs", "nope=1"], "knob 'nope' does not apply to dense"),
        (["bench", "--baseline", "eager"], "--baseline 'eager'"),
        (["bench", "--json", "--markdown"], "choose one"),
        (["bench", "--against", "no-such-ref"], "no git ref 'no-such-ref'"),
        (["tune", "--tp", "4", "--rows", "9"], "--rows '9'"),
        (["tune", "--tp", "4", "--rows", "2", "--kind", "dense", "--space", "nope"], "--space: nope"),
        (["tune", "--tp", "4,8", "--rows", "2", "--study", "x"], "--study names one study"),
        (["tune", "--tp", "4", "--rows", "2", "--write", "--search-only"], "a worker decides nothing"),
        (["bench", "--kind", "dense", "--context", "4096"], "--context applies to the kinds that read caches"),
        (["bench", "--kind", "sparse", "--context", "4K"], "--context '4K'"),
        (["bench", "--kind", "sparse", "--context", "-1"], "--context '-1'"),
        (["tune", "--tp", "4", "--rows", "2", "--kind", "kda", "--context", "8"], "not to kda"),
        (["bench", "--kind", "model", "--baseline", "separate"], "--baseline separate: not for model"),
        (["tune", "--tp", "4", "--rows", "1", "--kind", "model"], "a whole step is not tuned"),
        (["check", "--kind", "embed", "--tp", "4", "--gpus", "2"], "--gpus 2 runs TP2 keys"),
        (["check", "--kind", "embed", "--gpus", "2"], "say the TP width too"),
        (["fault", "--kind", "embed", "--tp", "2", "--gpus", "2", "--site", "1"], "--gpus sticks a peer's publish"),
    ],
)
def test_timing_commands_check_their_options_first(capsys, args, says):
    code, out, err = invoke(capsys, *args)
    assert code == 2 and out == "" and says in err and "Traceback" not in err


def test_unknown_option_is_usage_error(capsys):
    code, _, _ = invoke(capsys, "configs", "show", "--bogus")
    assert code == 2


def test_user_error_has_no_traceback(capsys):
    code, out, err = invoke(capsys, "configs", "show", "--model", "nope")
    assert code == 2 and out == ""
    assert "Error: unknown model 'nope'" in err and "Hint:" in err and "Traceback" not in err


def test_debug_variable_shows_traceback(capsys, monkeypatch):
    monkeypatch.setenv("GLM53CTL_DEBUG", "1")
    code, _, err = invoke(capsys, "configs", "show", "--model", "nope")
    assert code == 2 and "Traceback" in err


def _run(*code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=120)


def test_help_imports_no_torch_triton_optuna():
    p = _run(
        "import sys",
        "from glm53ctl.cli import run_cli",
        "code = run_cli(['--help'])",
        "code2 = run_cli(['configs', 'show', '--help'])",
        "heavy = [m for m in ('torch', 'triton', 'optuna') if m in sys.modules]",
        "print(code, code2, heavy)",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().endswith("0 0 []"), p.stdout


def test_python_dash_m_and_console_script():
    p = subprocess.run([sys.executable, "-m", "glm53ctl", "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == f"glm53ctl {__version__}"
    p = subprocess.run([sys.executable, "-m", "glm53ctl", "tune"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("Error:") and "Traceback" not in p.stderr


@pytest.mark.parametrize("verb", ["check", "run"])
def test_on_a_cpu_the_launching_commands_choose_the_interpreter_themselves(verb, tmp_path):
    """The README's first command, `glm53ctl check`, with no TRITON_INTERPRET in the environment (a new user's
    shell; the tests' conftest sets it). Before: the command's module imported the kernels before `check` chose
    the interpreter, and every key died "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["--kind", "tail", "--tp", "1", "--rows", "1"]
    if verb == "run":
        args += ["--backend", "triton", "--out", str(tmp_path / "t.safetensors")]
    p = subprocess.run([sys.executable, "-m", "glm53ctl", verb, *args], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr


def test_readme_test_command_is_what_ci_runs():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme, ci = (root / "README.md").read_text(), (root / ".ci" / "run").read_text()
    assert "python -m pytest -q -n auto\n" in readme and ci.rstrip().endswith("python -m pytest -q -n auto")


@pytest.mark.parametrize(
    "args, message",
    [
        (["nope"], "Error: No such command 'nope'."),
        (["configs", "diff"], "Error: Missing argument 'A.json'."),
        (
            ["run", "--kind", "tail", "--out", "x.safetensors", "--backend", "cuda"],
            "Error: Invalid value for '--backend'",
        ),
        (["check", "--bogus"], "Error: No such option: --bogus"),
    ],
)
def test_usage_errors_speak_the_projects_style(capsys, args, message):
    """Before: Typer's boxed panel for these, the project's `Error:`/`Hint:` for the others. One style now."""
    code, out, err = invoke(capsys, *args)
    assert code == 2 and out == ""
    assert message in err and "Hint: `glm53ctl" in err and "╭" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("typed", "said"),
    [
        ("--bogus", "Error: No such option: --bogus\n"),  # nothing alike: Click's own cutoff said --gpus, --rows
        ("--rowz", "Error: No such option: --rowz (did you mean --rows?)\n"),
        ("--all-key", "Error: No such option: --all-key (did you mean --all-keys?)\n"),
        ("--kinds", "Error: No such option: --kinds (did you mean --kind?)\n"),
    ],
)
def test_an_unknown_option_is_suggested_only_what_is_close(capsys, typed, said):
    code, _, err = invoke(capsys, "check", typed, "2")
    assert code == 2 and err.startswith(said), err


def test_every_line_of_a_multi_line_error_says_error(capsys):
    from glm53ctl.output import print_error

    print_error("a.json: tp: bad\na.json: model: bad", "fix both")
    err = capsys.readouterr().err.splitlines()
    assert err == ["Error: a.json: tp: bad", "Error: a.json: model: bad", "Hint: fix both"]


@functools.cache
def _all_help() -> dict[str, str]:
    import typer

    from glm53ctl.cli import app

    group = typer.main.get_command(app)
    paths = [[name] for name in group.list_commands(None)]
    paths += [["configs", name] for name in group.get_command(None, "configs").commands]
    return {
        " ".join(p): subprocess.run([sys.executable, "-m", "glm53ctl", *p, "-h"], capture_output=True, text=True).stdout
        for p in paths
    }


def test_help_reads_like_the_commands_usage():
    """Before: `--json <bool>`, `configs diff ... {a} {b}`, `validate <list[Path]>`: Python's types in help."""
    for path, text in _all_help().items():
        assert text.startswith(f"Usage: glm53ctl {path}"), path
        for junk in ("<bool>", "<str>", "<int>", "<float>", "<path>", "list[", "{a}", "{b}", "╭"):
            assert junk not in text, (path, junk)
    helps = _all_help()
    assert "glm53ctl configs diff [OPTIONS] A.json B.json" in helps["configs diff"]
    assert "glm53ctl configs validate [OPTIONS] [FILE...]" in helps["configs validate"]
    assert "--backend reference|triton" in helps["run"] and "  --json " in helps["check"]


def test_readme_names_only_options_the_commands_have():
    """Every `--option` the README's command table gives for bench and tune is in that command's help."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    helps = _all_help()
    for name in ("bench", "tune"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `glm53ctl {name}"))
        for option in re.findall(r"--[a-z][a-z-]*", row):
            assert option in helps[name], (name, option)


def test_every_package_folder_is_in_pyproject():
    """CI installs editable, which finds any folder; a wheel holds only the listed packages."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setup["packages"])
    on_disk = set()
    for name, folder in setup["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(root / folder).parts
            on_disk.add(".".join((name, *rel)))
    assert listed == on_disk, listed ^ on_disk


def test_counts_agree_with_their_nouns():
    """'1 key', never '1 keys' (issue 30): output.plural says a count, and no message puts a bare count before a
    plural noun (`{len(keys)} keys`), which reads '1 keys' at one."""
    import re

    from glm53ctl.output import plural

    assert [plural(n, "keys") for n in (0, 1, 2)] == ["0 keys", "1 key", "2 keys"]
    assert plural(1, "processes", "process") == "1 process" and plural(3, "processes", "process") == "3 processes"
    root = Path(__file__).resolve().parents[2]
    bare = re.compile(r"\{(len\([^}]*\)|tot\[[^]]*\]|n_\w+)\} (keys|sites|files|tensors|kernels|hangs|retries|peers)\b")
    found = [
        f"{p.relative_to(root)}:{i}: {line.strip()}"
        for folder in ("glm53ctl", "kernels", "tuning")
        for p in sorted((root / folder).rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if bare.search(line)
    ]
    assert not found, "\n".join(found)


def test_a_gpu_out_of_memory_is_said_in_one_line(monkeypatch, capsys):
    """torch's CUDA out-of-memory error from any command (check --against over many keys filled an 80 GB H100):
    `Error:` with torch's first two sentences (what it asked for) and a hint, exit 2, no traceback; any other error
    still propagates."""
    import torch

    from glm53ctl import cli

    def full(**_):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.13 GiB. GPU 0 has a total capacity")

    monkeypatch.setattr(cli, "app", full)
    assert cli._run(["check"]) == 2
    err = capsys.readouterr().err
    assert "Error: the GPU ran out of memory: CUDA out of memory. Tried to allocate 1.13 GiB" in err
    assert "fewer keys" in err and "Traceback" not in err and "total capacity" not in err

    def other(**_):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "app", other)
    with pytest.raises(RuntimeError):
        cli._run(["check"])
