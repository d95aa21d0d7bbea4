import pytest

from glm53ctl.errors import ConfigError, UsageError
from glm53ctl.kernels.spec import TP_WIDTHS, load_model, load_model_file, models_dir
from tests.helpers import write


@pytest.fixture(scope="module")
def flash():
    return load_model("glm53_flash")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny")


def test_glm53_flash_dims_are_spec_1_1(flash):
    assert (flash.hidden, flash.model.vocab_size, flash.model.num_layers) == (4096, 154880, 45)
    assert (flash.kda.heads, flash.kda.head_dim, flash.kda.conv_kernel, flash.kda.gate_lower_bound) == (
        64,
        128,
        4,
        -5.0,
    )
    m = flash.mla
    assert (m.heads, m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim) == (
        64,
        1536,
        512,
        256,
        0,
        256,
    )
    ix = flash.indexer
    assert (ix.heads, ix.head_dim, ix.topk, ix.kpool, flash.index_width, flash.index_pools) == (
        32,
        128,
        2048,
        4,
        2051,
        512,
    )
    moe = flash.moe
    assert (moe.experts, moe.top_k, moe.intermediate_size, moe.dense_intermediate_size) == (288, 8, 2048, 12288)
    assert (moe.routed_scaling_factor, moe.swiglu_limit, flash.mhc.streams, flash.mhc.sinkhorn_iters) == (
        2.5,
        10.0,
        4,
        20,
    )


def test_glm53_flash_layer_schedule(flash):
    dsa = [i for i, (a, _) in enumerate(flash.layers) if a == "dsa"]
    assert dsa == list(range(3, 45, 4)) and len(dsa) == 11
    assert [f for _, f in flash.layers[:4]] == ["dense", "dense", "dense", "moe"]
    assert sum(f == "moe" for _, f in flash.layers) == 42


def test_tiny_has_the_real_structure(tiny):
    assert tiny.mhc.streams == 4 and tiny.mhc.sinkhorn_iters > 1
    assert tiny.kda.heads > 1 and tiny.indexer.kpool == 4
    assert tiny.moe.experts >= 8 and tiny.moe.top_k >= 2 and tiny.moe.shared_experts == 1
    assert tiny.layers[0] == ("kda", "dense") and ("dsa", "moe") in tiny.layers and ("kda", "moe") in tiny.layers
    assert [a for a, _ in tiny.layers][:4] == ["kda", "kda", "kda", "dsa"]
    # a context past index_width really drops pools in tests
    assert tiny.index_width < 64
    # the scales of docs/model.md §11 traps 1 and 4 are distinguishable at this width
    assert tiny.mla.qk_nope_head_dim != tiny.mla.kv_lora_rank
    assert tiny.indexer.head_dim != tiny.indexer.heads


@pytest.mark.parametrize("name", ["tiny", "glm53_flash"])
def test_every_sharded_dim_splits_into_dot_tiles_at_tp8(name):
    spec = load_model(name)
    for dim, value in spec.sharded_dims().items():
        assert value % 8 == 0, dim
    s8 = spec.shards(8)
    for width in (s8.vocab, s8.kda_proj, s8.mla_heads * spec.mla.v_head_dim, s8.expert_inter, s8.dense_inter):
        assert width % 16 == 0


@pytest.mark.parametrize("tp", TP_WIDTHS)
def test_shard_shapes_follow_spec_8(flash, tp):
    w = flash.shards(tp).weight_shapes()
    assert w["kda"]["q_proj.weight"] == (8192 // tp, 4096)
    assert w["kda"]["b_proj.weight"] == (64 // tp, 4096)
    assert w["kda"]["f_a_proj.weight"] == (128, 4096)  # replicated
    assert w["kda"]["f_b_proj.weight"] == (8192 // tp, 128)
    assert w["kda"]["o_proj.weight"] == (4096, 8192 // tp)
    assert w["dsa"]["q_a_proj.weight"] == (1536, 4096)  # replicated
    assert w["dsa"]["q_b_proj.weight"] == (16384 // tp, 1536)
    assert w["dsa"]["kv_b_proj.weight"] == (32768 // tp, 512)
    assert w["dsa"]["o_proj.weight"] == (4096, 16384 // tp)
    assert w["dsa"]["indexer.wq_b.weight"] == (4096, 1536)  # replicated
    assert w["dense"]["gate_proj.weight"] == (12288 // tp, 4096)
    assert w["moe"]["experts.down_proj.weight"] == (288, 4096, 2048 // tp)
    assert w["moe"]["gate.weight"] == (288, 4096)
    assert w["embed"]["embed_tokens.weight"] == (154880 // tp, 4096)
    assert w["tail"]["lm_head.weight"] == (154880 // tp, 4096)
    st = flash.shards(tp).state_shapes(rows=2, max_context=64)
    assert st["kda.recurrent"] == (2, 64 // tp, 128, 128) and st["kda.conv"] == (2, 3, 3 * 8192 // tp)


def test_tp_that_does_not_divide_is_refused(tiny, tmp_path):
    with pytest.raises(UsageError, match="TP 3 is not supported"):
        tiny.shards(3)
    text = (models_dir() / "tiny.toml").read_text()
    text = text.replace('name = "tiny"', 'name = "odd"').replace("heads = 8 ", "heads = 12 ")
    odd = write(tmp_path / "odd.toml", text)
    spec = load_model_file(odd)
    spec.shards(4)
    with pytest.raises(UsageError, match=r"cannot be sharded at TP 8: kda.heads = 12 not divisible by 8"):
        spec.shards(8)


def _broken(tmp_path, old, new):
    text = (models_dir() / "tiny.toml").read_text()
    assert old in text
    return write(tmp_path / "tiny.toml", text.replace(old, new, 1))


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ("heads = 8 ", 'heads = "eight" ', r"tiny.toml: kda.heads: Input should be a valid integer"),
        ("head_dim = 16\n", "head_dim = 16\nhead_dimm = 3\n", r"tiny.toml: kda.head_dimm: unknown key"),
        ("gate_rank = 16\n", "", r"tiny.toml: kda.gate_rank: required key is missing"),
        ("qk_rope_head_dim = 0", "qk_rope_head_dim = 64", r"tiny.toml: mla.qk_rope_head_dim: Input should be 0"),
        ("[moe]", "[moe\n", r"tiny.toml: not valid TOML"),
    ],
)
def test_bad_model_file_names_file_and_key(tmp_path, old, new, expected):
    with pytest.raises(ConfigError, match=expected):
        load_model_file(_broken(tmp_path, old, new))


def test_cross_field_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"tiny.toml: indexer.topk: must be a multiple of indexer.kpool \(4\)"):
        load_model_file(_broken(tmp_path, "topk = 32", "topk = 30"))
    with pytest.raises(ConfigError, match=r"tiny.toml: moe.top_k: must not exceed moe.experts"):
        load_model_file(_broken(tmp_path, "top_k = 4", "top_k = 40"))
