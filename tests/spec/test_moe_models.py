"""Mixture-of-experts models (issue 38): exact total and active parameter counts derived by hand from each
model's HF config.json and tensor list, cross-checked with the published totals; HF config.json reading of
Mixtral, Qwen3-MoE, DeepSeek-V3 / Kimi K2 and GPT-OSS; the built-in names; dense models unchanged."""

import json
from dataclasses import replace

import pytest

from autotune.errors import ConfigError
from autotune.spec.hf_config import model_from_hf_config
from autotune.spec.models import MOE_CATALOG, ModelSpec, get_builtin_model, get_model


def M(name):
    return MOE_CATALOG[name]


# ---------------------------------------------------------------- parameter counts, by hand
def test_mixtral_8x7b_counts():
    # HF mistralai/Mixtral-8x7B-v0.1: h 4096, 32 layers, 32 q / 8 kv heads of 128, 8 experts of 14336, top-2,
    # vocab 32000, untied. Tensors per layer: q_proj 4096x4096 = 16,777,216; k_proj, v_proj 1024x4096 =
    # 4,194,304 each; o_proj 16,777,216 -> attention 41,943,040. One expert w1, w2, w3: 3 x 4096 x 14336 =
    # 176,160,768; gate 8 x 4096 = 32,768; two RMSNorms 8,192.
    layer = 41_943_040 + 8 * 176_160_768 + 32_768 + 8_192                 # 1,451,270,144
    active_layer = 41_943_040 + 2 * 176_160_768 + 32_768 + 8_192           # 394,305,536
    emb = head = 32000 * 4096                                              # 131,072,000 each
    total = emb + head + 32 * layer + 4096                                 # + final norm
    assert total == 46_702_792_704                                         # model card: 46.7B
    assert M("mixtral-8x7b").num_params == total
    assert M("mixtral-8x7b").num_active_params == emb + head + 32 * active_layer + 4096 == 12_879_925_248  # 12.9B


def test_mixtral_8x22b_counts():
    # Mixtral-8x22B-v0.1: h 6144, 56 layers, 48 q / 8 kv heads of 128, 8 experts of 16384, top-2, vocab 32000.
    # Attention: q 6144x6144 = 37,748,736; k, v 6144x1024 = 6,291,456 each; o 37,748,736 -> 88,080,384.
    # Expert 3 x 6144 x 16384 = 301,989,888; gate 8 x 6144 = 49,152; norms 12,288.
    layer = 88_080_384 + 8 * 301_989_888 + 49_152 + 12_288
    active_layer = 88_080_384 + 2 * 301_989_888 + 49_152 + 12_288
    emb2 = 2 * 32000 * 6144
    m = M("mixtral-8x22b")
    assert m.num_params == emb2 + 56 * layer + 6144 == 140_620_634_112          # Mistral AI: 141B
    assert m.num_active_params == emb2 + 56 * active_layer + 6144 == 39_152_031_744   # Mistral AI: 39B active


def test_qwen3_30b_a3b_counts():
    # HF Qwen/Qwen3-30B-A3B: h 2048, 48 layers, 32 q / 4 kv heads of 128, q_norm + k_norm (128 each), 128 experts
    # of 768, top-8, vocab 151936, untied. Attention: q 2048x4096 = 8,388,608; k, v 2048x512 = 1,048,576 each;
    # o 8,388,608; q/k norms 256 -> 18,874,624. Expert 3 x 2048 x 768 = 4,718,592; router 128 x 2048 = 262,144;
    # norms 4,096.
    layer = 18_874_624 + 128 * 4_718_592 + 262_144 + 4_096                # 623,120,640
    active_layer = 18_874_624 + 8 * 4_718_592 + 262_144 + 4_096            # 56,889,600
    emb2 = 2 * 151936 * 2048                                               # 622,329,856
    assert emb2 + 48 * layer + 2048 == 30_532_122_624                      # the figure
    m = M("qwen3-30b-a3b")
    assert m.num_params == 30_532_122_624
    assert m.num_active_params == emb2 + 48 * active_layer + 2048 == 3_353_032_704   # card: 3.3B activated


def test_qwen3_235b_a22b_counts():
    # h 4096, 94 layers, 64 q / 4 kv heads of 128, 128 experts of 1536, top-8. Attention: q 4096x8192 =
    # 33,554,432; k, v 4096x512 = 2,097,152 each; o 33,554,432; q/k norms 256 -> 71,303,424. Expert 3 x 4096 x
    # 1536 = 18,874,368; router 524,288; norms 8,192.
    layer = 71_303_424 + 128 * 18_874_368 + 524_288 + 8_192               # 2,487,755,008
    active_layer = 71_303_424 + 8 * 18_874_368 + 524_288 + 8_192           # 222,830,848
    emb2 = 2 * 151936 * 4096                                               # 1,244,659,712
    m = M("qwen3-235b-a22b")
    assert m.num_params == emb2 + 94 * layer + 4096 == 235_093_634_560     # card: 235B
    assert m.num_active_params == emb2 + 94 * active_layer + 4096 == 22_190_763_520   # card: 22B


# DeepSeek-V3 MLA attention (HF DeepseekV3Attention, no biases): q_a_proj 7168x1536 = 11,010,048; q_a_layernorm
# 1,536; q_b_proj 1536 x 128*(128+64) = 37,748,736; kv_a_proj_with_mqa 7168 x (512+64) = 4,128,768;
# kv_a_layernorm 512; kv_b_proj 512 x 128*(128+128) = 16,777,216; o_proj 128*128 x 7168 = 117,440,512.
DSV3_ATTN = 11_010_048 + 1_536 + 37_748_736 + 4_128_768 + 512 + 16_777_216 + 117_440_512      # 187,107,328
DSV3_EXPERT = 3 * 7168 * 2048                                                                  # 44,040,192
DSV3_DENSE = DSV3_ATTN + 3 * 7168 * 18432 + 2 * 7168                                           # 583,483,392
# MoE layer: 256 routed + 1 shared expert, gate 256 x 7168 = 1,835,008 and e_score_correction_bias 256, 2 norms
DSV3_MOE = DSV3_ATTN + 256 * DSV3_EXPERT + DSV3_EXPERT + 1_835_008 + 256 + 2 * 7168             # 11,507,286,272
DSV3_MOE_ACTIVE = DSV3_ATTN + 8 * DSV3_EXPERT + DSV3_EXPERT + 1_835_008 + 256 + 2 * 7168        # 585,318,656
DSV3_EMB = 129280 * 7168                                                                       # 926,679,040


def test_deepseek_v3_counts_without_mtp():
    # 3 dense + 58 MoE layers, untied embedding and head, final norm
    m = replace(M("deepseek-v3"), mtp_num_layers=0)
    total = 2 * DSV3_EMB + 3 * DSV3_DENSE + 58 * DSV3_MOE + 7168
    assert m.num_params == total == 671_026_419_200                        # README / paper: 671B
    active = 2 * DSV3_EMB + 3 * DSV3_DENSE + 58 * DSV3_MOE_ACTIVE + 7168
    assert m.num_active_params == active == 37_552_297_472                 # paper: 37B activated
    assert m.num_moe_layers == 58 and m.moe_layer_pattern == (0, 0, 0) + (1,) * 58


def test_deepseek_v3_counts_with_mtp():
    # The MTP module (checkpoint model.layers.61): enorm, hnorm (7168 each), eh_proj 7168 x 14336 = 102,760,448,
    # one MoE decoder layer, shared_head.norm 7168; embed_tokens and shared_head.head share the main model's
    # (README_WEIGHTS.md), so they are not unique parameters.
    mtp = 3 * 7168 + 102_760_448 + DSV3_MOE                                # 11,610,068,224 (README: 11.5B unique)
    m = M("deepseek-v3")
    assert m.mtp_num_layers == 1 and m.mtp_params_per_layer == mtp
    assert m.num_params == 671_026_419_200 + mtp == 682_636_487_424
    # the checkpoint stores the embedding and head again: 684,489,845,504 = HF's "685B" (671B + 14B MTP)
    assert m.num_params + m.mtp_stored_duplicate_params == 684_489_845_504
    assert m.num_active_params == 37_552_297_472 + 3 * 7168 + 102_760_448 + DSV3_MOE_ACTIVE == 38_240_398_080


def test_kimi_k2_counts():
    # Kimi K2: DeepSeek-V3's shape with 64 heads, 384 experts, 1 dense layer, vocab 163840, no MTP.
    # Attention: q_a 11,010,048 + 1,536 + q_b 1536 x 64*192 = 18,874,368 + kv_a 4,128,768 + 512 + kv_b 512 x 64*256
    # = 8,388,608 + o 64*128 x 7168 = 58,720,256 -> 101,124,096.
    attn = 11_010_048 + 1_536 + 18_874_368 + 4_128_768 + 512 + 8_388_608 + 58_720_256
    dense = attn + 3 * 7168 * 18432 + 2 * 7168
    moe = attn + 385 * DSV3_EXPERT + 384 * 7168 + 384 + 2 * 7168           # 384 routed + 1 shared, gate + bias
    moe_active = attn + 9 * DSV3_EXPERT + 384 * 7168 + 384 + 2 * 7168
    emb2 = 2 * 163840 * 7168
    m = M("kimi-k2")
    assert m.num_params == emb2 + dense + 60 * moe + 7168 == 1_026_408_232_448       # README: 1T (1.0264T)
    assert m.num_active_params == emb2 + dense + 60 * moe_active + 7168 == 32_861_500_928   # card: 32B activated


# GPT-OSS attention (HF GptOssAttention): q 2880 x 64*64 = 11,796,480; k, v 2880 x 512 = 1,474,560 each;
# o 11,796,480; biases 4096 + 512 + 512 + 2880 = 8,000; sinks 64 -> 26,550,144. One expert: gate_up 2880 x 5760
# + bias 5760, down 2880 x 2880 + bias 2880 = 24,891,840. Norms 5,760. Embedding and head 201088 x 2880 each.
OSS_ATTN = 11_796_480 + 2 * 1_474_560 + 11_796_480 + 8_000 + 64
OSS_EXPERT = 2880 * 5760 + 5760 + 2880 * 2880 + 2880
OSS_EMB = 201088 * 2880


@pytest.mark.parametrize("name,layers,experts,total,active_no_emb", [
    # model cards: gpt-oss-20b 20.9B total, 3.6B active; gpt-oss-120b 116.8B total, 5.1B active (OpenAI's active
    # figure leaves out the input embedding, keeps the unembedding)
    ("gpt-oss-20b", 24, 32, 20_914_757_184, 3_608_307_264),
    ("gpt-oss-120b", 36, 128, 116_829_156_672, 5_132_849_472)])
def test_gpt_oss_counts(name, layers, experts, total, active_no_emb):
    router = experts * 2880 + experts                                      # weight + bias
    layer = OSS_ATTN + experts * OSS_EXPERT + router + 5_760
    active_layer = OSS_ATTN + 4 * OSS_EXPERT + router + 5_760
    m = M(name)
    assert m.num_params == 2 * OSS_EMB + layers * layer + 2880 == total
    assert m.num_active_params == 2 * OSS_EMB + layers * active_layer + 2880
    assert m.num_active_params_without_embedding == OSS_EMB + layers * active_layer + 2880 == active_no_emb


def test_deepseek_16b_counts():
    # torchtitan deepseek_v3 "16B": h 2048, 27 layers (1 dense of 10944), 16 heads, q_lora_rank 0, kv_lora 512,
    # 64 experts of 1408 + 2 shared, top-6, vocab 102400, no router bias. Attention: wq 2048 x 16*192 = 6,291,456;
    # kv_a 2048 x 576 = 1,179,648 + kv norm 512; kv_b 512 x 16*256 = 2,097,152; o 16*128 x 2048 = 4,194,304
    # -> 13,763,072. Expert 3 x 2048 x 1408 = 8,650,752.
    attn = 6_291_456 + 1_179_648 + 512 + 2_097_152 + 4_194_304
    assert attn == 13_763_072
    expert = 3 * 2048 * 1408
    dense = attn + 3 * 2048 * 10944 + 4096
    moe = attn + 66 * expert + 64 * 2048 + 4096
    moe_active = attn + 8 * expert + 64 * 2048 + 4096
    m = M("deepseek-16b")
    assert m.num_params == 2 * 102400 * 2048 + dense + 26 * moe + 2048 == 15_706_484_224       # DeepSeek-V2-Lite 15.7B
    assert m.num_active_params == 2 * 102400 * 2048 + dense + 26 * moe_active + 2048 == 2_661_150_208


# ---------------------------------------------------------------- HF config.json
HF = {
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
                     "max_position_embeddings": 32768, "sliding_window": None, "router_aux_loss_coef": 0.02,
                     "hidden_act": "silu"},
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                      "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "norm_topk_prob": True, "vocab_size": 151936, "tie_word_embeddings": False,
                      "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 40960,
                      "attention_bias": False, "use_sliding_window": False, "hidden_act": "silu"},
    "deepseek-v3": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
                    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
                    "n_routed_experts": 256, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
                    "moe_layer_freq": 1, "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc",
                    "scoring_func": "sigmoid", "norm_topk_prob": True, "routed_scaling_factor": 2.5,
                    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "num_nextn_predict_layers": 1, "vocab_size": 129280,
                    "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 10000,
                    "max_position_embeddings": 163840, "attention_bias": False, "hidden_act": "silu",
                    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}},
    "gpt-oss-20b": {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
                    "intermediate_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
                    "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4,
                    "experts_per_token": 4, "attention_bias": True, "sliding_window": 128,
                    "layer_types": ["sliding_attention", "full_attention"] * 12, "vocab_size": 201088,
                    "tie_word_embeddings": False, "rms_norm_eps": 1e-5, "rope_theta": 150000,
                    "max_position_embeddings": 131072, "swiglu_limit": 7.0, "hidden_act": "silu",
                    "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "original_max_position_embeddings": 4096, "truncate": False}},
}
# Kimi K2 (model_type kimi_k2, DeepseekV3ForCausalLM) and GPT-OSS-120B differ from these in a few fields
HF["kimi-k2"] = dict(HF["deepseek-v3"], model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64,
                     n_routed_experts=384, first_k_dense_replace=1, n_group=1, topk_group=1,
                     routed_scaling_factor=2.827, num_nextn_predict_layers=0, vocab_size=163840, rope_theta=50000.0,
                     max_position_embeddings=131072,
                     rope_scaling={"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096})
HF["gpt-oss-120b"] = dict(HF["gpt-oss-20b"], num_hidden_layers=36, num_local_experts=128,
                          layer_types=["sliding_attention", "full_attention"] * 18)
HF["qwen3-235b-a22b"] = dict(HF["qwen3-30b-a3b"], hidden_size=4096, intermediate_size=12288,
                             moe_intermediate_size=1536, num_hidden_layers=94, num_attention_heads=64)


def _load(tmp_path, cfg):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return model_from_hf_config(p)


@pytest.mark.parametrize("name", sorted(HF))
def test_hf_config_reads_as_the_builtin(tmp_path, name):
    got = _load(tmp_path, HF[name])
    want = M(name)
    # named by the config's folder (no _name_or_path here) and a short hash of its contents (issue 42)
    assert got.name.startswith(tmp_path.name + "@")
    assert replace(got, name=want.name) == want
    assert got.num_params == want.num_params and got.num_active_params == want.num_active_params


def test_hf_config_without_model_type_uses_architectures(tmp_path):
    cfg = {k: v for k, v in HF["mixtral-8x7b"].items() if k != "model_type"}
    assert _load(tmp_path, cfg).num_params == 46_702_792_704


@pytest.mark.parametrize("change,match", [
    ({"model_type": "qwen3_moe", "decoder_sparse_step": 2}, "decoder_sparse_step=2"),
    ({"model_type": "qwen3_moe", "mlp_only_layers": [0]}, "mlp_only_layers"),
    ({"model_type": "qwen3_moe", "num_experts_per_tok": 200}, "moe_top_k=200 must be between 1 and num_experts=128"),
    ({"model_type": "qwen3_moe", "num_experts": 0}, "num_experts must be"),
    ({"model_type": "qwen3_moe", "num_experts": 4.0}, "num_experts"),
])
def test_hf_moe_config_refusals(tmp_path, change, match):
    cfg = dict(HF["qwen3-30b-a3b"], **change)
    with pytest.raises(ConfigError, match=match):
        _load(tmp_path, cfg)


def test_hf_deepseek_and_gpt_oss_refusals(tmp_path):
    with pytest.raises(ConfigError, match="first_k_dense_replace|num_first_dense_layers=99 exceeds"):
        _load(tmp_path, dict(HF["deepseek-v3"], first_k_dense_replace=99))
    with pytest.raises(ConfigError, match="num_key_value_heads=8"):
        _load(tmp_path, dict(HF["deepseek-v3"], num_key_value_heads=8))
    with pytest.raises(ConfigError, match="layer_types"):
        _load(tmp_path, dict(HF["gpt-oss-20b"], layer_types=["full_attention", "sliding_attention"] * 12))
    with pytest.raises(ConfigError, match="missing field 'n_routed_experts'"):
        _load(tmp_path, {k: v for k, v in HF["deepseek-v3"].items() if k != "n_routed_experts"})


def test_hf_deepseek_v2_lite_shape(tmp_path):
    # DeepSeek-V2-Lite's config (deepseek_v2: q_lora_rank null, softmax, greedy top-k, no correction bias) is the
    # torchtitan 16B flavour's shape; its vocab is 102400 and its first layer dense
    cfg = dict(HF["deepseek-v3"], model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], hidden_size=2048,
               intermediate_size=10944, moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
               num_key_value_heads=16, n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6,
               first_k_dense_replace=1, n_group=1, topk_group=1, topk_method="greedy", scoring_func="softmax",
               routed_scaling_factor=1.0, q_lora_rank=None, num_nextn_predict_layers=None, vocab_size=102400,
               rms_norm_eps=1e-5)
    m = _load(tmp_path, cfg)
    assert m.num_params == M("deepseek-16b").num_params == 15_706_484_224
    assert not m.router_expert_bias and m.q_lora_rank == 0


def test_unsupported_moe_family_named(tmp_path):
    with pytest.raises(ConfigError, match="model_type 'dbrx'.*supported mixture-of-experts model_types: mixtral"):
        _load(tmp_path, {"model_type": "dbrx", "hidden_size": 6144})


# ---------------------------------------------------------------- spec invariants, dense unchanged
def test_dense_models_unchanged_by_the_moe_fields():
    # the MoE fields sit at their defaults, out of to_dict and the fingerprint: study names and files stay
    for size in ("8b", "70b", "405b"):
        m = get_model(size)
        assert not m.is_moe and not m.is_mla and m.num_active_params == m.num_params
        d = m.to_dict()
        assert "num_experts" not in d and "kv_lora_rank" not in d and ModelSpec.from_dict(d) == m
    assert get_model("8b").fingerprint() == ModelSpec(**{**get_model("8b").__dict__}).fingerprint()


def test_moe_spec_round_trips_and_validates():
    m = M("deepseek-v3")
    assert ModelSpec.from_dict(m.to_dict()) == m
    with pytest.raises(ConfigError, match="moe_top_k=9 must be between 1 and num_experts=8"):
        replace(M("mixtral-8x7b"), moe_top_k=9)
    with pytest.raises(ConfigError, match="set on a model without experts"):
        replace(get_model("8b"), moe_top_k=2)
    with pytest.raises(ConfigError, match="head_dim must be qk_nope_head_dim"):
        replace(m, head_dim=128)
    with pytest.raises(ConfigError, match="router_num_groups=7 must divide"):
        replace(m, router_num_groups=7)
    # a --layers proxy of DeepSeek-V3 keeps its dense-first layers within the depth
    assert m.truncated(2).num_moe_layers == 0 and m.truncated(5).num_moe_layers == 2


def test_builtin_names():
    assert get_builtin_model("DeepSeek-V3") is M("deepseek-v3")
    assert get_builtin_model("405b") is get_model("405b")
    assert get_builtin_model("llama3.1-70b") is get_model("70b")
    assert get_builtin_model("no-such-model") is None


def test_an_engine_without_expert_parallelism_refuses_an_moe_model():
    # the native runtime builds dense Llama blocks only (its facts.yaml moe_dispatchers: []): one line naming
    # the model, the engine and the engines that can; Megatron-LM and torchtitan take it
    from autotune.errors import PlanError
    from autotune.spec.engines import check_model_for_engine, get_engine

    check_model_for_engine(get_model("405b"), get_engine("native"))
    check_model_for_engine(M("deepseek-v3"), get_engine("megatron"))
    with pytest.raises(PlanError, match="deepseek-v3 is a mixture-of-experts model; engine native cannot run it: "
                                        ".*engines that can: megatron, torchtitan"):
        check_model_for_engine(M("deepseek-v3"), get_engine("native"))
