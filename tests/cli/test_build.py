"""`glm53ctl build`: ahead-of-time builds for sm_90 on a CPU, and `--against` a git ref."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glm53ctl.kernels.build import compare, fill_sass, find_nvdisasm, find_ptxas, sass_of_cached, unnamed_sass
from glm53ctl.worktree import run_cli
from tests.cli.conftest import edit, git
from tests.helpers import invoke, invoke_json

ROOT = Path(__file__).resolve().parents[2]


def test_build_reports_resources_per_kernel(capsys, tmp_path):
    doc = invoke_json(capsys, "build", "--model", "tiny", "--tp", "1,2", "--rows", "1", "-j", "2", "--out", tmp_path)
    keys = {e["key"]: e for e in doc["keys"]}
    assert set(keys) == {
        f"tiny/{kind}/tp{t}/r1" for kind in ("embed", "dense", "kda", "sparse", "tail") for t in (1, 2)
    }
    assert [k["role"] for k in keys["tiny/tail/tp2/r1"]["kernels"]] == ["launch", "peer"]
    # a layer peer's partial launches (its attention half, its FFN half) run rank 0's code with another table, whose
    # size the kernel is specialized on
    for kind in ("dense", "kda", "sparse"):
        assert [k["role"] for k in keys[f"tiny/{kind}/tp2/r1"]["kernels"]] == ["launch", "peer.attn", "peer.ffn"]
    for e in doc["keys"]:
        for k in e["kernels"]:
            assert k["symbol"] in ("embed_kernel", "tail_kernel", "layer_kernel")
            assert 0 < k["registers"] <= 255 and k["spill_stores"] >= 0 and k["stack"] >= 0
            assert k["shared"] >= 0 and len(k["hash"]) == 16
    assert doc["totals"]["kernels"] == 18 and doc["target"] == "sm_90"
    assert json.loads((tmp_path / "manifest.json").read_text())["totals"] == doc["totals"]
    # unchanged keys cost nothing the second time
    again = invoke_json(capsys, "build", "--model", "tiny", "--tp", "1,2", "--rows", "1", "--out", tmp_path)
    assert again["totals"]["compiled"] == 0
    assert [k["hash"] for e in again["keys"] for k in e["kernels"]] == [
        k["hash"] for e in doc["keys"] for k in e["kernels"]
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "nope"], "--kind 'nope': expected values from embed, dense, kda, sparse, tail, model"),
        (["--tp", "3"], "--tp '3': expected values from 1, 2, 4, 8"),
        (["--rows", "x"], "--rows 'x': expected a comma-separated list"),
        (["--target", "hopper"], "--target 'hopper': expected sm_<capability>"),
        # before: exit 1 with the compiler's internals (sm_999), or its PTX on stdout (sm_30)
        (["--target", "sm_999"], "--target 'sm_999': not a target Triton builds for"),
        (["--target", "sm_30"], "--target 'sm_30': not a target Triton builds for"),
        (["--against", "no-such-ref-xyz"], "no git ref 'no-such-ref-xyz'"),
    ],
)
def test_build_bad_input(capsys, tmp_path, args, message):
    code, out, err = invoke(capsys, "build", "--model", "tiny", *args, "--out", tmp_path)
    assert code == 2 and message in err and "Traceback" not in err


def test_build_out_must_be_a_folder_and_a_read_only_manifest_is_kept(capsys, tmp_path):
    """Before: --out on a file compiled first, then failed with a traceback; a read-only manifest was replaced."""
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = invoke(capsys, "build", "--model", "tiny", "--kind", "embed", "--tp", "1", "--out", f)
    assert code == 2 and "is a file" in err and "Traceback" not in err
    (tmp_path / "b").mkdir()
    manifest = tmp_path / "b" / "manifest.json"
    manifest.write_text("{}")
    manifest.chmod(0o444)
    code, _, err = invoke(capsys, "build", "--model", "tiny", "--kind", "embed", "--tp", "1", "--out", tmp_path / "b")
    assert code == 2 and "read-only" in err and manifest.read_text() == "{}"


def test_build_without_ptxas_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "ptxas"))
    code, _, err = invoke(
        capsys, "build", "--model", "tiny", "--kind", "embed", "--tp", "1", "--rows", "1", "--out", tmp_path
    )
    assert code == 2 and "no ptxas at" in err


def test_build_refuses_a_key_the_model_cannot_shard(capsys, tmp_path):
    text = (ROOT / "configs" / "models" / "tiny.toml").read_text()
    odd = tmp_path / "odd.toml"
    odd.write_text(text.replace('name = "tiny"', 'name = "odd"').replace("heads = 8 ", "heads = 12 "))
    code, _, err = invoke(capsys, "build", "--model", str(odd), "--kind", "embed", "--tp", "8", "--out", tmp_path)
    assert code == 2 and "cannot be sharded at TP 8: kda.heads = 12 not divisible by 8" in err
    code, _, err = invoke(capsys, "build", "--model", "nope", "--out", tmp_path)
    assert code == 2 and "unknown model 'nope'" in err


@pytest.mark.slow
def test_against_names_exactly_the_keys_whose_code_changed(repo, tmp_path):
    """Two commits of a copy of this project: the second changes the embed kernel's arithmetic only."""
    old = "b_e = tl.load(table + e_row * D + o_d, mask=(o_d < D) & mine, other=0.0).to(tl.float32)"
    edit(repo, "kernels/ops/embed/kernel.py", old, old + " * 2.0")
    p = run_cli(
        repo,
        [
            "build",
            "--against",
            "HEAD~1",
            "--model",
            "tiny",
            "--kind",
            "embed,tail",
            "--tp",
            "1,2",
            "--rows",
            "1,2",
            "-j",
            "2",
            "--json",
            "--out",
            str(tmp_path / "build"),
        ],
    )
    assert p.returncode == 0
    doc = json.loads(p.stdout)
    status = {r["key"]: r["status"] for r in doc["keys"]}
    assert {k for k, s in status.items() if s == "changed"} == {
        f"tiny/embed/tp{t}/r{r}" for t in (1, 2) for r in (1, 2)
    }
    assert {k for k, s in status.items() if s == "unchanged"} == {
        f"tiny/tail/tp{t}/r{r}" for t in (1, 2) for r in (1, 2)
    }
    assert doc["summary"] == "4 of 8 builds change against HEAD~1"


@pytest.mark.slow
def test_compile_error_names_the_key_and_the_compiler_message(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "glm53ctl", repo / "glm53ctl")
    shutil.copytree(ROOT / "kernels", repo / "kernels")
    shutil.copytree(ROOT / "tuning", repo / "tuning")
    shutil.copytree(ROOT / "configs", repo / "configs")
    kernel = repo / "kernels" / "kinds" / "embed" / "kernel.py"
    old = "o_d = d0 + tl.arange(0, CHUNK)"
    assert old in kernel.read_text()
    kernel.write_text(kernel.read_text().replace(old, "o_d = d0 + tl.arange(0, 3)"))
    args = [
        "build",
        "--model",
        "tiny",
        "--kind",
        "embed",
        "--tp",
        "1",
        "--rows",
        "1",
        "-j",
        "1",
        "--out",
        str(tmp_path),
    ]
    p = run_cli(repo, args, capture_stderr=True)
    assert p.returncode == 1 and p.stdout == ""
    assert "Error: tiny/embed/tp1/r1 (launch): CompilationError" in p.stderr and "arange" in p.stderr
    assert "Traceback" not in p.stderr


def test_build_takes_a_tuned_register_cap(capsys, tmp_path, monkeypatch):
    """Knob `maxnreg` (here a tuned config's) reaches ptxas: glm53_flash's dense kernel takes 240-255 registers
    by the compiler's choice, at most 168 under the cap."""
    from glm53ctl.paths import config_root
    from tests.configs.test_tuned import doc

    conf = tmp_path / "conf"
    shutil.copytree(config_root() / "models", conf / "models")
    d = doc(model="glm53_flash", tp=8)
    d["entries"] = {"dense": {"2": {"knobs": {"maxnreg": 168}}}}
    (conf / "tuned" / "glm53_flash").mkdir(parents=True)
    (conf / "tuned" / "glm53_flash" / "tp8.json").write_text(json.dumps(d))
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(conf))
    args = ("build", "--model", "glm53_flash", "--kind", "dense", "--tp", "8", "--rows", "1,2", "-j", "2", "--no-carry")
    built = invoke_json(capsys, *args, "--out", tmp_path / "out")
    regs = {e["key"]: e["kernels"][0]["registers"] for e in built["keys"]}
    assert all(e["carried"] == [] for e in built["keys"])  # --no-carry: the keys' own launches only
    assert regs["glm53_flash/dense/tp8/r2"] <= 168 < regs["glm53_flash/dense/tp8/r1"]


def test_ptxas_report_is_parsed_to_its_figures():
    """The figures of a real `ptxas -v` report (sm_90a, a kernel with a stack and spills), not merely present."""
    from glm53ctl.kernels.build import parse_ptxas

    report = (
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'dense_kernel' for 'sm_90a'\n"
        "ptxas info    : Function properties for dense_kernel\n"
        "    24 bytes stack frame, 148 bytes spill stores, 152 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 24 bytes cumulative stack size, 568 bytes cmem[0]\n"
    )
    assert parse_ptxas(report) == {"registers": 255, "stack": 24, "spill_stores": 148, "spill_loads": 152}
    assert parse_ptxas("ptxas info    : Used 40 registers, 380 bytes cmem[0]\n") == {
        "registers": 40,
        "stack": 0,
        "spill_stores": 0,
        "spill_loads": 0,
    }


@pytest.mark.slow
def test_against_tells_a_renamed_function_from_changed_code(repo, tmp_path):
    """HEAD renames a noinline task body (its mangled name is in the PTX and the cubin): the cubin changes, the
    code and the machine code do not, and `build --against` says so ("renamed", the SASS compared with the names
    numbered). Where ptxas chose other machine code for the same PTX, it would say "reallocated": such a change
    can move the speed by itself (docs/perf/path/2026-12-07-ptx-identity.md)."""
    path = "kernels/ops/kda/layer.py"
    text = (repo / path).read_text()
    (repo / path).write_text(text.replace("task_inproj", "task_in_projection"))
    git(repo, "commit", "-qam", "rename a task body")
    args = ["build", "--against", "HEAD~1", "--model", "tiny", "--kind", "dense", "--tp", "1", "--rows", "1"]
    p = run_cli(repo, [*args, "--no-carry", "-j", "2", "--json", "--out", str(tmp_path / "build")])
    assert p.returncode == 0
    doc = json.loads(p.stdout)
    (row,) = doc["keys"]
    assert row["status"] == "renamed" and all(d["same_code"] and d["same_sass"] for d in row["diff"]), row
    assert doc["summary"] == (
        "1 of 1 build changes against HEAD~1 (1 only renamed: the same machine code but for its functions' names)"
    )


def test_against_tells_renamed_reallocated_and_changed_code_apart():
    """A key whose cubins differ: renamed where every differing kernel has REF's machine code (names aside),
    reallocated where it has REF's PTX but other machine code, changed otherwise; a side without a record of
    its SASS (an older manifest) is never called renamed."""

    def manifest(code, sass):
        rec = dict(role="launch", hash="new", registers=255, spill_stores=0, spill_loads=0, shared=0, stack=0)
        return {"keys": [{"key": "k", "kernels": [rec | {"code": code, "sass": sass}]}]}

    ref = manifest("c1", "s1")
    ref["keys"][0]["kernels"][0]["hash"] = "old"
    assert compare(ref, ref)[0]["status"] == "unchanged"
    assert compare(manifest("c1", "s1"), ref)[0]["status"] == "renamed"
    assert compare(manifest("c1", "s2"), ref)[0]["status"] == "reallocated"
    assert compare(manifest("c1", ""), ref)[0]["status"] == "reallocated"
    assert compare(manifest("c2", "s2"), ref)[0]["status"] == "changed"


def test_a_launch_one_side_lists_alone_is_no_change_when_both_build_its_code():
    """REF's manifest without the peers' launches (an older build listed only the key's own), of the code object
    both sides build: unchanged; a peer of new code is a change."""

    def manifest(*kernels):
        fields = dict(registers=255, spill_stores=0, spill_loads=0, shared=0, stack=0, code=None)
        return {"keys": [{"key": "k", "kernels": [{"role": r, "hash": h, **fields} for r, h in kernels]}]}

    theirs = manifest(("launch", "a"))
    (row,) = compare(manifest(("launch", "a"), ("peer.attn", "a"), ("peer.ffn", "a")), theirs)
    assert row == {"key": "k", "status": "unchanged", "diff": []}
    (row,) = compare(manifest(("launch", "a"), ("peer.attn", "b")), theirs)
    assert row["status"] == "changed" and [d["role"] for d in row["diff"]] == ["peer.attn"]
    # a stage launch more, of the same code object, is a change of the schedule
    (row,) = compare(manifest(("stage0.launch", "a"), ("stage1.launch", "a")), manifest(("stage0.launch", "a")))
    assert row["status"] == "changed" and [d["role"] for d in row["diff"]] == ["stage1.launch"]


def test_stages_of_their_own_code_build_smaller_kernels(capsys, tmp_path, monkeypatch):
    """Knob stage_code=own (here a tuned config's): each stage of a stages build is a kernel of its own, built for
    its own task types, with no more registers or shared memory than the one kernel every stage shares."""
    from glm53ctl.paths import config_root
    from tests.configs.test_tuned import doc

    conf = tmp_path / "conf"
    shutil.copytree(config_root() / "models", conf / "models")
    (conf / "tuned" / "tiny").mkdir(parents=True)
    monkeypatch.setenv("GLM53CTL_CONFIG_DIR", str(conf))
    built = {}
    for code in ("shared", "own"):
        d = doc(model="tiny", tp=1)
        d["entries"] = {"dense": {"1": {"knobs": {"launch": "stages", "stage_code": code}}}}
        (conf / "tuned" / "tiny" / "tp1.json").write_text(json.dumps(d))
        args = ("build", "--model", "tiny", "--kind", "dense", "--tp", "1", "--rows", "1", "--no-carry")
        built[code] = invoke_json(capsys, *args, "--out", tmp_path / code)["keys"][0]["kernels"]
    shared, own = built["shared"], built["own"]
    assert len(shared) == len(own) > 2 and len({k["hash"] for k in shared}) == 1
    assert len({k["hash"] for k in own}) == len(own)  # a kernel a stage
    one = shared[0]
    assert all(k["registers"] <= one["registers"] and k["shared"] <= one["shared"] for k in own)
    assert min(k["registers"] for k in own) < one["registers"] and min(k["shared"] for k in own) < one["shared"]


def _cubin_calling(tmp: Path, body_name: str, scale: int) -> bytes:
    """The cubin (sm_90, compiled on this CPU, outside the interpreter: tests/cli/sass_probe.py) of a kernel
    calling a noinline function named `body_name` in this project's namespace, which multiplies by `scale`."""
    out = tmp / f"{body_name}_{scale}.cubin"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, str(Path(__file__).with_name("sass_probe.py")), body_name, str(scale), str(out)],
                   env=env, check=True)  # fmt: skip
    assert b"glm53ctl" in out.read_bytes()
    return out.read_bytes()


def test_machine_code_is_compared_without_the_functions_names(tmp_path):
    """`sass`: the same machine code under another function name digests alike, other code does not; and a
    manifest from a tree that did not record it gets it from that build's kernel cache (`fill_sass`)."""
    nvdisasm = find_nvdisasm(find_ptxas())
    assert nvdisasm is not None  # the triton wheel ships it beside ptxas
    a, b, c = (_cubin_calling(tmp_path, n, k) for n, k in (("task_one", 3), ("task_other_name", 3), ("task_one", 5)))
    assert a != b
    assert unnamed_sass(a, nvdisasm) == unnamed_sass(b, nvdisasm) != unnamed_sass(c, nvdisasm)
    (tmp_path / "e1").mkdir()
    (tmp_path / "e1" / "probe.cubin").write_bytes(b)
    old = {"keys": [{"key": "k", "kernels": [{"role": "launch", "entry": "e1"}, {"role": "peer", "entry": "gone"}]}]}
    fill_sass(old, tmp_path)
    launch, peer = old["keys"][0]["kernels"]
    assert launch["sass"] == sass_of_cached(tmp_path, "e1", nvdisasm) != "" and peer["sass"] == ""
