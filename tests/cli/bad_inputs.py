"""Bad input to every command, as a new user types it (issue 30): each is an `Error:` naming what is wrong, a
`Hint:`, exit 2, no traceback, nothing on stdout. tests/cli/test_bad_inputs.py runs every case;
`python -m tests.cli.bad_inputs` prints the table of what each one said (markdown), for a review or a note.

A case's arguments may name files in the folder `place` makes (`{here}` is that folder): a file where a folder is
wanted, a file that is not JSON, a tuned file of a newer schema, two saved runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# (command line, what its error says); every one exits 2 on a machine with no GPU (bench and tune need one)
CASES: list[tuple[str, str]] = [
    # the command line itself
    ("frobnicate", "No such command 'frobnicate'"),
    ("--nope", "No such option"),
    ("run --kind tail --rows two --out x.safetensors", "Invalid value for '--rows'"),
    ("run --out x.safetensors", "Missing option '--kind'"),
    # configs
    ("configs show --model nope", "unknown model 'nope'"),
    ("configs show --model tiny --tp 3", "TP 3"),
    ("configs validate missing.json", "missing.json"),
    ("configs validate {here}/junk.json", "junk.json"),
    ("configs validate {here}/newer.json", "schema_version"),
    ("configs validate {here}/noschema.json", "schema_version"),
    ("configs diff missing1.json missing2.json", "missing1.json"),
    ("configs migrate missing.json", "missing.json"),
    ("configs frobnicate", "No such command 'frobnicate'"),
    # run
    ("run --kind attn --out {here}/x.safetensors", "unknown kind 'attn'"),
    ("run --kind tail --tp 3 --out {here}/x.safetensors", "TP 3 is not supported"),
    ("run --kind tail --rows 9 --out {here}/x.safetensors", "--rows 9: expected 1 to 8"),
    ("run --kind dense --rows 0 --out {here}/x.safetensors", "--rows 0: expected 1 to 8"),
    ("run --kind kda --layer 3 --out {here}/x.safetensors", "not a kda layer"),
    ("run --kind dense --layer 99 --out {here}/x.safetensors", "layer 99 is out of range"),
    ("run --kind tail --layer 0 --out {here}/x.safetensors", "--layer applies to the layer kinds"),
    ("run --kind tail --model nope --out {here}/x.safetensors", "unknown model 'nope'"),
    ("run --kind tail --model {here}/junk.toml --out {here}/x.safetensors", "not valid TOML"),
    ("run --kind tail --weights absent.safetensors --out {here}/x.safetensors", "no such weights file"),
    ("run --kind tail --out {here}/x.pt", "expected a .safetensors file"),
    ("run --kind tail --out {here}/no/x.safetensors", "does not exist"),
    ("run --kind tail --out {here}/afile/x.safetensors", "afile"),
    ("run --kind tail --out {here}/notes.safetensors", "not a safetensors file (left as it is)"),
    ("run --kind embed --tokens 5000 --out {here}/x.safetensors", "token id 5000 is out of range [0, 1024)"),
    ("run --kind embed --tokens a,b --out {here}/x.safetensors", "expected comma-separated integers"),
    ("run --kind embed --rows 2 --tokens 1 --out {here}/x.safetensors", "--tokens has 1 ids for 2 rows"),
    ("run --kind dense --tokens 1 --out {here}/x.safetensors", "--tokens applies to"),
    ("run --kind tail --steps 0 --out {here}/x.safetensors", "--steps 0: expected at least 1"),
    ("run --kind sparse --context -1 --out {here}/x.safetensors", "--context -1: expected 0 or more"),
    ("run --kind sparse --context 65536 --out {here}/x.safetensors", "max_position_embeddings (65,536)"),
    ("run --kind sparse --context 100000000000 --out {here}/x.safetensors", "max_position_embeddings"),
    ("run --kind sparse --model glm53_flash --context 131072 --out {here}/x.safetensors", "GB free"),
    ("run --kind tail --backend triton --precision fp64 --out {here}/x.safetensors", "--precision applies to"),
    ("run --kind tail --backend cuda --out {here}/x.safetensors", "Invalid value for '--backend'"),
    # build
    ("build --kind nope", "--kind 'nope'"),
    ("build --tp 3", "--tp '3'"),
    ("build --rows 9", "--rows '9'"),
    ("build --model nope", "nope"),
    ("build --target sm_70", "sm_70"),
    ("build -o {here}/afile/sub", "afile"),
    ("build -o {here}/afile", "afile"),
    ("build --against no-such-ref-xyz", "no-such-ref-xyz"),
    # report
    ("report", "Missing option '--against'"),
    ("report --against no-such-ref-xyz --kind embed", "no-such-ref-xyz"),
    ("report --against HEAD --parts check,nope", "--parts 'check,nope'"),
    ("report --against HEAD --kind dense --context 5", "--context applies to the kinds that read caches"),
    ("report --against HEAD --kind embed -o {here}/afile", "afile"),
    ("report --against {here} --kind embed", "not a glm53ctl tree"),
    # check
    ("check --kind nope", "--kind 'nope'"),
    ("check --tp 5", "--tp '5'"),
    ("check --rows 0", "--rows '0'"),
    ("check --jobs -1", "--jobs -1"),
    ("check --kind dense --context 5", "--context applies to the kinds that read caches"),
    ("check --kind sparse --context 100000000000", "max_position_embeddings"),
    ("check --kind embed --tp 1 --rows 1 --against no-such-ref-xyz", "no-such-ref-xyz"),
    ("check --gpus 3", "--gpus 3"),
    ("check --gpus 2 --against main", "--gpus takes no --against"),
    ("check --kind embed --launch nope", "--launch 'nope'"),
    ("check --model nope", "unknown model 'nope'"),
    ("check --kind embed --against HEAD --worktrees {here}/afile", "afile"),
    ("check --kind embed --cache {here}/afile", "--cache {here}/afile: not a folder"),
    ("run --kind embed --out /proc/x.safetensors", "--out /proc/x.safetensors: cannot write in /proc"),
    ("configs diff {here}/m.toml {here}/m.toml", "a model file; configs diff compares two tuned files"),
    ("build -m tiny --kind embed --out /proc/glm53ctl-x", "--out /proc/glm53ctl-x: cannot write in /proc"),
    ("check --kind embed --cache {here}", "not a kernel cache (no CACHE.json)"),
    ("bench --kind embed --cache /nonexistent-glm53ctl", "--cache /nonexistent-glm53ctl: no such folder"),
    # fault
    ("fault --kind nope", "--kind 'nope'"),
    ("fault --kind embed --tp 3", "--tp '3'"),
    ("fault --kind embed --site -1", "--site -1"),
    ("fault --kind embed --site 99", "--site 99"),
    ("fault --kind embed --budget-ms 0", "--budget-ms"),
    ("fault --kind embed --jobs -2", "--jobs -2"),
    # bench (a GPU's)
    ("bench --kind dense", "GPU"),
    ("bench --kind dense --json --markdown", "--json and --markdown"),
    # bench --gpus: on a CPU the GPU is what is missing; the options are checked first
    ("bench --kind dense --gpus 2", "timing needs a CUDA GPU"),
    ("bench --kind dense --gpus 3", "--gpus 3: one rank per GPU at a TP width"),
    ("bench --kind dense --gpus 2 --tp 4", "--gpus 2 times TP2 keys"),
    ("bench --kind dense --gpus 2 --against main", "no --against or --trace with it"),
    ("bench --kind dense --gpus 2 --trace", "no --against or --trace with it"),
    ("bench --kind dense --perfetto t.json", "--perfetto FILE writes the traced launches: give --trace too"),
    ("bench --op nope", "--op 'nope': expected values from select, select3, select2, select1, select0, route"),
    ("bench --op select0 --sizes 8192", "select0's sizes are pools, 1 to 4096"),
    ("bench --sizes 3", "--sizes: the sizes of an --op"),
    ("bench --op route --sizes 16", "the routing's sizes are rows, 1 to 8"),
    ("bench --op gate --sizes 1,32", "gate's sizes are rows, 1 to 16"),
    ("bench --op select --sizes x", "--sizes 'x'"),
    ("bench --op route --kind dense", "no --kind with it"),
    ("bench --kind dense --baseline nope", "--baseline 'nope'"),
    ("bench --kind model --baseline separate", "--baseline separate: not for model"),
    ("bench --kind dense,model --baseline chain", "--baseline chain: a step's"),
    ("bench --kind sparse --context x", "--context 'x'"),
    ("bench --kind dense --context 5", "--context applies to the kinds that read caches"),
    ("bench --kind sparse --context 100000000000", "max_position_embeddings"),
    ("bench --kind dense --knobs nope=1", "nope"),
    ("bench --kind dense --save {here}/afile", "--save"),
    # tune (a GPU's, but --plots)
    ("tune --tp 4 --rows 9", "--rows '9'"),
    ("tune --kind model --tp 4 --rows 1", "a whole step is not tuned"),
    ("tune --kind dense --tp 4 --rows 1 --storage notaurl", "--storage notaurl"),
    ("tune --kind dense --tp 4 --rows 1 --storage foo://bar", "foo"),
    ("tune --kind dense --tp 4 --rows 1 --storage sqlite:///nofolder/s.db", "nofolder"),
    ("tune --kind dense --tp 4 --rows 1 --storage {here}/junk.json.log", "journal"),
    ("tune --kind dense --tp 4 --rows 1 --storage postgresql://me@127.0.0.1:1/db --plots {here}/p", "cannot open"),
    ("tune --kind dense --tp 4 --rows 1 --write --search-only", "--write and --search-only"),
    ("tune --kind dense --tp 4,8 --rows 1 --study s", "--study names one study"),
    ("tune --kind dense --tp 4 --rows 1 --plots {here}/afile", "--plots"),
    ("tune --kind dense --tp 4 --rows 1 --space nope", "nope"),
    ("tune --kind dense --tp 4 --rows 1", "GPU"),
    # compare
    ("compare nope.safetensors x.safetensors", "nope.safetensors"),
    ("compare {here} {here}", "folder"),
    ("compare {here}/a.safetensors {here}/b.safetensors --bound -1", "--bound"),
    ("compare {here}/a.safetensors {here}/b.safetensors --bound nan", "--bound"),
    ("compare {here}/a.safetensors {here}/notes.safetensors", "notes.safetensors"),
    # prune
    ("prune --cache /nonexistent-glm53ctl", "/nonexistent-glm53ctl"),
    ("prune --cache {here}/afile", "afile"),
]


def place(here: Path) -> Path:
    """The files the cases name, made in `here`."""
    import torch
    from safetensors.torch import save_file

    here.mkdir(parents=True, exist_ok=True)
    (here / "afile").write_text("a file, not a folder\n")
    (here / "notes.safetensors").write_text("my notes\n")
    (here / "junk.json").write_text("{not json\n")
    (here / "junk.toml").write_text("name = \n")
    (here / "junk.json.log").write_text("hello\n")
    (here / "newer.json").write_text(json.dumps({"schema_version": 99, "model": "tiny", "tp": 4, "entries": []}))
    (here / "noschema.json").write_text(json.dumps({"model": "tiny", "tp": 4, "entries": []}))
    for name in ("a", "b"):
        save_file({"t": torch.zeros(3)}, str(here / f"{name}.safetensors"))
    return here


def args_of(case: str, here: Path) -> list[str]:
    return [a.replace("{here}", str(here)) for a in case.split()]


def error_of(err: str) -> str:
    """The message of an `Error:` as one line (a long one wraps at the console's width), without its hint."""
    text = err[err.find("Error:") :] if "Error:" in err else err
    return " ".join(text.split("\nHint:")[0].split()).removeprefix("Error: ")


def table(here: Path) -> str:
    """Every case run in this process: a markdown table of its exit code and its message (the Error line)."""
    import contextlib
    import io

    from glm53ctl.cli import run_cli

    place(here)
    lines = ["| # | command | exit | message |", "| --- | --- | --- | --- |"]
    for i, (case, _) in enumerate(CASES, 1):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = run_cli(args_of(case, here))
        shown = error_of(err.getvalue()).replace(str(here), "D").replace("|", "\\|")
        lines.append(f"| {i} | `glm53ctl {case.replace('{here}', 'D')}` | {code} | {shown} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile

    os.environ.setdefault("TRITON_INTERPRET", "1")
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        print(table(Path(tmp) / "D"))
    sys.exit(0)
