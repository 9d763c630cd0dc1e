"""Model catalog: parameter counts equal the published ones exactly; HF config.json parsing."""

import json

import pytest

from autotune.errors import ConfigError
from autotune.models import ModelSpec, get_model, model_from_hf_config


@pytest.mark.parametrize("size,params", [
    # Published counts (Hugging Face model cards / safetensors metadata of meta-llama/Llama-3.1-*).
    ("8b", 8_030_261_248), ("70b", 70_553_706_496), ("405b", 405_853_388_800)])
def test_llama31_parameter_counts_exact(size, params):
    assert get_model(size).num_params == params


def test_8b_parameter_formula_by_hand():
    # 2Vh = 2*128256*4096 = 1,050,673,152; per layer h(h+2*8*128) + h^2 + 3*h*ffn + 2h
    # = 4096*6144 + 4096^2 + 3*4096*14336 + 8192 = 218,112,000; *32 = 6,979,584,000; + h = 4096.
    m = get_model("8b")
    assert m.params_per_layer == 218_112_000
    assert m.num_params == 1_050_673_152 + 6_979_584_000 + 4096
    # design.md: 6 x 7.505e9 non-embedding parameters = 45.03 GFLOP/token
    assert m.num_params_without_embedding == 8_030_261_248 - 128256 * 4096


def test_unknown_size_lists_known():
    with pytest.raises(ConfigError, match="8b, 70b, 405b"):
        get_model("13b")


def test_hf_config_round_trip(tmp_path):
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
           "hidden_act": "silu", "rope_theta": 500000.0, "model_type": "llama"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert model_from_hf_config(p).num_params == 8_030_261_248


def test_hf_config_gelu_tied(tmp_path):
    # Plain GeLU MLP (2 projections) and tied embeddings: V h once.
    # h=64, L=2, heads=4 (d=16), kv=4, f=256, V=100:
    # per layer: 64*(64+128) + 64*64 + 2*64*256 + 128 = 12288 + 4096 + 32768 + 128 = 49280
    # total: 100*64 + 2*49280 + 64 = 6400 + 98560 + 64 = 105024
    cfg = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
           "vocab_size": 100, "tie_word_embeddings": True, "hidden_act": "gelu"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = model_from_hf_config(p)
    assert not m.gated_mlp and m.tied_embeddings
    assert m.num_params == 105_024


def test_hf_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        model_from_hf_config(tmp_path / "missing.json")
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ConfigError, match="num_attention_heads"):
        model_from_hf_config(p)


def test_bad_spec():
    with pytest.raises(ConfigError, match="num_kv_heads"):
        ModelSpec(name="x", hidden_size=64, num_layers=2, num_heads=6, num_kv_heads=4, ffn_hidden_size=128,
                  vocab_size=10)


def test_truncated_proxy():
    # 8B at 4 layers: 2Vh + 4 x 218,112,000 + h = 1,050,673,152 + 872,448,000 + 4096 = 1,923,125,248
    m = get_model("8b").truncated(4)
    assert m.num_params == 1_923_125_248 and m.name == "llama3.1-8b-4L" and m.hidden_size == 4096
    with pytest.raises(ConfigError, match="between 1 and"):
        get_model("8b").truncated(33)
