"""Model catalog: parameter counts equal the published ones exactly; HF config.json parsing."""

import json

import pytest

from autotune.errors import ConfigError
from autotune.spec.hf_config import model_from_hf_config
from autotune.spec.models import ModelSpec, get_model


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


# ---- HF configs per architecture against published parameter counts -----------------------------------
# The configs are the architecture fields of each model's config.json on the Hugging Face hub; the
# expected counts are the published totals (model card / safetensors metadata). Each derivation below
# follows the module formula: 2Vh (or Vh tied) + L (h(q+2kv) + q h + bias + 3hf + r h) + h,
# with q = n_q d, kv = n_kv d.
HF_CONFIGS = {
    # Llama-2-7B: q = kv = 4096; layer = 4*4096^2 + 3*4096*11008 + 2*4096 = 67,108,864 + 135,266,304 + 8,192
    #   = 202,383,360; x32 = 6,476,267,520; + 2*32000*4096 = 262,144,000; + 4096 = 6,738,415,616.
    "llama-2-7b": ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                    "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000, "hidden_act": "silu",
                    "tie_word_embeddings": False, "max_position_embeddings": 4096}, 6_738_415_616),
    # Llama-3.2-1B (tied): d = 64, q = 2048, kv = 512; layer = 2048*3072 + 2048^2 + 3*2048*8192 + 4096
    #   = 6,291,456 + 4,194,304 + 50,331,648 + 4,096 = 60,821,504; x16 = 973,144,064; + 128256*2048 =
    #   262,668,288; + 2048 = 1,235,814,400.
    "llama-3.2-1b": ({"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256,
                      "hidden_act": "silu", "tie_word_embeddings": True, "max_position_embeddings": 131072,
                      "rope_theta": 500000.0}, 1_235_814_400),
    # Qwen2.5-7B (q/k/v biases): q = 3584, kv = 512; layer = 3584*4608 + 3584^2 + 4608 + 3*3584*18944 + 7168
    #   = 16,515,072 + 12,845,056 + 4,608 + 203,685,888 + 7,168 = 233,057,792; x28 = 6,525,618,176;
    #   + 2*152064*3584 = 1,089,986,560; + 3584 = 7,615,616,512 (without the biases: -28*4608 = -129,024).
    "qwen2.5-7b": ({"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28,
                    "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064, "hidden_act": "silu",
                    "tie_word_embeddings": False, "max_position_embeddings": 131072, "sliding_window": 131072,
                    "use_sliding_window": False}, 7_615_616_512),
    # Mistral-7B-v0.1: q = 4096, kv = 1024; layer = 4096*6144 + 4096^2 + 3*4096*14336 + 8192 = 218,112,000;
    #   x32 = 6,979,584,000; + 2*32000*4096 = 262,144,000; + 4096 = 7,241,732,096.
    "mistral-7b-v0.1": ({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
                         "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                         "vocab_size": 32000, "hidden_act": "silu", "tie_word_embeddings": False,
                         "max_position_embeddings": 32768, "sliding_window": 4096}, 7_241_732_096),
    # Gemma-7B (GeGLU with hidden_act gelu, tied by default, head_dim 256 != 3072/16): q = kv = 4096;
    #   layer = 3072*12288 + 4096*3072 + 3*3072*24576 + 6144 = 37,748,736 + 12,582,912 + 226,492,416 + 6,144
    #   = 276,830,208; x28 = 7,751,245,824; + 256000*3072 = 786,432,000; + 3072 = 8,537,680,896.
    "gemma-7b": ({"model_type": "gemma", "hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                  "num_key_value_heads": 16, "head_dim": 256, "intermediate_size": 24576, "vocab_size": 256000,
                  "hidden_act": "gelu", "max_position_embeddings": 8192}, 8_537_680_896),
    # Gemma-2-9B (4 norms per layer, tied): q = 4096, kv = 2048; layer = 3584*8192 + 4096*3584
    #   + 3*3584*14336 + 4*3584 = 29,360,128 + 14,680,064 + 154,140,672 + 14,336 = 198,195,200; x42 =
    #   8,324,198,400; + 256000*3584 = 917,504,000; + 3584 = 9,241,705,984.
    "gemma-2-9b": ({"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
                    "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
                    "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
                    "sliding_window": 4096}, 9_241_705_984),
    # Phi-3-mini-4k: layer = 4*3072^2 + 3*3072*8192 + 6144 = 37,748,736 + 75,497,472 + 6,144 = 113,252,352;
    #   x32 = 3,624,075,264; + 2*32064*3072 = 197,001,216; + 3072 = 3,821,079,552.
    "phi-3-mini-4k": ({"model_type": "phi3", "hidden_size": 3072, "num_hidden_layers": 32, "num_attention_heads": 32,
                       "num_key_value_heads": 32, "intermediate_size": 8192, "vocab_size": 32064,
                       "hidden_act": "silu", "tie_word_embeddings": False, "max_position_embeddings": 4096,
                       "sliding_window": 2047}, 3_821_079_552),
}


@pytest.mark.parametrize("name", sorted(HF_CONFIGS))
def test_hf_config_published_parameter_counts(tmp_path, name):
    cfg, published = HF_CONFIGS[name]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert model_from_hf_config(p).num_params == published


def test_gemma_gated_and_tied_by_default(tmp_path):
    cfg, _ = HF_CONFIGS["gemma-7b"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = model_from_hf_config(p)
    assert m.gated_mlp and m.tied_embeddings and m.head_dim == 256 and not m.qkv_bias


def test_study_name_fingerprint_differs_per_architecture(tmp_path):
    # Llama-2-7B and Llama-3.2-1B are both model_type llama: their names (hence studies) must differ.
    names = set()
    for n in ("llama-2-7b", "llama-3.2-1b"):
        p = tmp_path / f"{n}.json"
        p.write_text(json.dumps(HF_CONFIGS[n][0]))
        names.add(model_from_hf_config(p).name)
    # each named by its file (a config that is not config.json: its stem), then the fingerprint
    assert len(names) == 2 and {x.split("@")[0] for x in names} == {"llama-2-7b", "llama-3.2-1b"}


def test_sliding_window_refused_only_beyond_window(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(HF_CONFIGS["mistral-7b-v0.1"][0]))
    m = model_from_hf_config(p)
    assert m.check_sequence(4096) is None          # within the window SWA == full causal attention
    with pytest.raises(ConfigError, match="sliding-window"):
        m.check_sequence(8192)
    # Qwen2.5 declares a window but does not use it (use_sliding_window: false)
    p.write_text(json.dumps(HF_CONFIGS["qwen2.5-7b"][0]))
    assert model_from_hf_config(p).sliding_window is None
    # beyond max_position_embeddings: a warning, not an error (4096 for Llama 2)
    p.write_text(json.dumps(HF_CONFIGS["llama-2-7b"][0]))
    assert "max_position_embeddings" in model_from_hf_config(p).check_sequence(8192)


@pytest.mark.parametrize("cfg,match", [
    ({"model_type": "dbrx"}, "mixture-of-experts model is not supported"),
    ({"model_type": "llama", "num_local_experts": 8}, "num_local_experts"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
])
def test_hf_config_refused_by_name(tmp_path, cfg, match):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=match):
        model_from_hf_config(p)


def test_hf_features_rope_scaling_and_unchanged_study_names(tmp_path):
    from autotune.spec.models import RopeScaling

    def load(cfg):
        (tmp_path / "m").mkdir(exist_ok=True)
        p = tmp_path / "m" / "config.json"
        p.write_text(json.dumps(cfg))
        return model_from_hf_config(p)

    llama2 = dict(HF_CONFIGS["llama-2-7b"][0])
    mistral = dict(HF_CONFIGS["mistral-7b-v0.1"][0])
    # fingerprints as the code before mlp_activation / rope_scaling / features were recorded gave them
    # (commit d52b4a5): a config without those features keeps its fingerprint; the name before the @ is the
    # config.json's folder (m), no longer its model_type (issue 42: "llama@6141b5e5" named no model)
    assert load(llama2).name == "m@a1657e3f"
    assert load(mistral).name == "m@43456069"
    # Llama 3.2 style scaling is recorded, and changes the fingerprint (another architecture)
    scaled = load(dict(llama2, rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))
    assert scaled.rope_scaling == RopeScaling("llama3", 32.0, 1.0, 4.0, 8192) and scaled.name != "m@a1657e3f"
    # transformers 5: rope_theta and the scaling inside rope_parameters; "default" is no scaling
    v5 = load(dict(llama2, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    assert v5.rope_theta == 1e6 and v5.rope_scaling is None
    # Gemma 2's features, by name
    g2 = load(dict(HF_CONFIGS["gemma-2-9b"][0], attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   query_pre_attn_scalar=256))
    assert g2.mlp_activation == "gelu_pytorch_tanh" and g2.gated_mlp
    assert "attention logit soft-capping 50" in g2.features and "final logit soft-capping 30" in g2.features
    assert not any("query_pre_attn_scalar" in f for f in g2.features)     # 256 = head_dim: the usual scale
    # the features survive a plan file / study round trip; the catalog's scaling fills old files in
    assert ModelSpec.from_dict(g2.to_dict()) == g2
    old = {k: v for k, v in get_model("8b").to_dict().items() if k != "rope_scaling"}
    assert ModelSpec.from_dict(old) == get_model("8b")
    with pytest.raises(ConfigError, match="rope_scaling type 'su' is unknown"):
        load(dict(llama2, rope_scaling={"type": "su", "factor": 2.0}))


def test_hf_model_named_by_folder_or_name_or_path(tmp_path):
    # a downloaded model's folder names it; _name_or_path, when the config has one, wins
    cfg = dict(HF_CONFIGS["llama-2-7b"][0])
    cfg.pop("_name_or_path", None)
    d = tmp_path / "Llama-2-7b-hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    assert model_from_hf_config(d / "config.json").name.startswith("Llama-2-7b-hf@")
    (d / "config.json").write_text(json.dumps(dict(cfg, _name_or_path="org/Other-Name")))
    assert model_from_hf_config(d / "config.json").name.startswith("Other-Name@")
