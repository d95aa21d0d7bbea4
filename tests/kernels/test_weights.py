import hashlib

import pytest
import torch
from safetensors.torch import save_file

from glm53ctl.errors import ConfigError, UsageError
from glm53ctl.kernels.spec import load_model
from glm53ctl.kernels.weights import ROOT, Weights, load_weights, save_weights, tensor_table


@pytest.fixture(scope="module")
def spec():
    return load_model("tiny")


def test_seeded_weights_are_fixed_bits(spec):
    """Identical on any machine: pinned digests of two tensors (a change of generator shows here)."""
    w = Weights(spec, seed=0)
    digest = lambda t: hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()[:16]
    a = w.shard("lm_head.weight")
    assert a.dtype == torch.bfloat16 and a.shape == (1024, 128)
    assert digest(a) == digest(Weights(spec, seed=0).shard("lm_head.weight"))
    assert digest(a) != digest(Weights(spec, seed=1).shard("lm_head.weight"))
    assert digest(a) == PINNED["lm_head.weight"]


# sha256 prefix of the bf16 bytes, torch CPU generator (stable across machines and torch versions so far)
PINNED = {"lm_head.weight": "ae47e3413b1862c6"}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_rank_shards_are_slices_of_the_full_tensor(spec, tp):
    w = Weights(spec, seed=5)
    for name, info in w.table.items():
        if info.split is None or (".experts." in name and ".experts.0." not in name):
            continue  # one routed expert stands for all
        full = w.shard(name)
        parts = [w.shard(name, r, tp) for r in range(tp)]
        assert torch.equal(torch.cat(parts, dim=info.split), full), name


def test_dtypes_follow_the_checkpoint(spec):
    t = tensor_table(spec)
    L0, L3 = f"{ROOT}layers.0.", f"{ROOT}layers.3."
    assert t[f"{L0}self_attn.A_log"].dtype == torch.float32
    assert t[f"{L0}self_attn.q_conv1d.weight"].dtype == torch.float32
    assert t[f"{L0}hc_attn_fn"].dtype == torch.float32
    assert t[f"{L0}self_attn.q_proj.weight"].dtype == torch.bfloat16
    assert t[f"{L3}mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert t[f"{L3}self_attn.indexer.index_kpool_compress_ape"].dtype == torch.float32
    assert f"{L3}mlp.experts.15.down_proj.weight" in t and f"{L3}mlp.shared_experts.up_proj.weight" in t
    assert f"{L0}mlp.gate_proj.weight" in t and f"{L0}mlp.gate.weight" not in t


def test_safetensors_round_trip(spec, tmp_path):
    w = Weights(spec, seed=2)
    names = [n for n in w.table if ".layers.0." in n]
    path = tmp_path / "w.safetensors"
    save_weights(path, w, names)
    loaded = load_weights(path, spec, partial=True)
    for n in names:
        assert torch.equal(loaded.shard(n, 1, 4), w.shard(n, 1, 4))
    with pytest.raises(ConfigError, match=r"w.safetensors: missing tensor 'lm_head.weight'"):
        loaded.shard("lm_head.weight")
    with pytest.raises(ConfigError, match=r"missing tensor '.*' \(and \d+ more\)"):
        load_weights(path, spec)


def test_misshapen_or_unknown_tensor_is_named(spec, tmp_path):
    name = f"{ROOT}layers.0.self_attn.q_proj.weight"
    path = tmp_path / "bad.safetensors"
    save_file({name: torch.zeros(3, 3, dtype=torch.bfloat16)}, str(path))
    with pytest.raises(
        ConfigError, match=r"tensor '.*q_proj.weight' is \(3, 3\) torch.bfloat16, expected \(128, 128\)"
    ):
        load_weights(path, spec, partial=True)
    save_file({name: torch.zeros(128, 128, dtype=torch.float32)}, str(path))
    with pytest.raises(ConfigError, match=r"expected \(128, 128\) torch.bfloat16"):
        load_weights(path, spec, partial=True)
    save_file({"model.extra": torch.zeros(1)}, str(path))
    with pytest.raises(ConfigError, match=r"unexpected tensor 'model.extra'"):
        load_weights(path, spec, partial=True)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file")
    with pytest.raises(ConfigError, match="not a safetensors file"):
        load_weights(tmp_path / "junk.safetensors", spec)
    with pytest.raises(UsageError, match="no such weights file"):
        load_weights(tmp_path / "absent.safetensors", spec)


def _checkpoint_folder(folder, spec, drop=None, retype=None):
    """tiny's seeded weights as a Hugging Face checkpoint: two shard files and their index."""
    import json

    from safetensors.torch import save_file

    w = Weights(spec, seed=4)
    names = sorted(w.table)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, part in halves.items():
        tensors = {n: w.shard(n).contiguous() for n in part if n != drop}
        if retype in tensors:
            tensors[retype] = tensors[retype].float()
        save_file(tensors, str(folder / file))
        weight_map |= dict.fromkeys(tensors, file)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return w


def test_a_checkpoint_folder_gives_each_rank_its_slice(tmp_path):
    """A Hugging Face layout (shards, index, the checkpoint's names): every rank's shard equal to the same
    weights drawn in memory, rows or columns or whole, read as that slice alone."""
    spec = load_model("tiny")
    w = _checkpoint_folder(tmp_path, spec)
    loaded = load_weights(tmp_path, spec)
    by_split = {}
    for name, info in w.table.items():
        by_split.setdefault(info.split, name)
    assert set(by_split) == {None, 0, 1}
    for name in by_split.values():
        for tp in (1, 4):
            for rank in range(tp):
                assert torch.equal(loaded.shard(name, rank, tp), w.shard(name, rank, tp)), (name, tp, rank)


@pytest.mark.parametrize("broken", ["drop", "retype"])
def test_a_checkpoint_folder_names_its_missing_or_mistyped_tensor(tmp_path, broken):
    spec = load_model("tiny")
    name = f"{ROOT}layers.3.self_attn.q_a_proj.weight"
    _checkpoint_folder(tmp_path, spec, **{broken: name})
    says = f"missing tensor '{name}'" if broken == "drop" else f"'{name}' is .* torch.float32, expected"
    with pytest.raises(ConfigError, match=says):
        load_weights(tmp_path, spec)
