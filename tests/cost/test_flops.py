"""FLOPs per token against design.md's reference values."""

import pytest

from autotune.cost.flops import attention_flops_per_token, mfu, model_flops_per_token
from autotune.spec.models import get_model


# design.md / issue 2: causal 51.47 / 449.22 / 2523.96 and PaLM 57.91 / 481.44 / 2625.45 GFLOP per token
# at T = 8192. Exact values from the formula 6N + 6 L H Q T c are 51.472 / 449.2305 / 2523.9809 (causal)
# and 57.9144 / 481.4427 / 2625.4495 (PaLM). The causal 70B/405B references are 0.01/0.02 below the exact
# values; they are not consistent with their own PaLM figures (PaLM - causal attention term, 481.4427 -
# 32.2123 = 449.2305), so they are matched to 0.025 GFLOP and the PaLM ones to 0.005.
@pytest.mark.parametrize("size,causal,palm", [("8b", 51.47, 57.91), ("70b", 449.22, 481.44),
                                              ("405b", 2523.96, 2625.45)])
def test_reference_gflop_per_token(size, causal, palm):
    m = get_model(size)
    assert model_flops_per_token(m, 8192) / 1e9 == pytest.approx(causal, abs=0.025)
    assert model_flops_per_token(m, 8192, causal=False) / 1e9 == pytest.approx(palm, abs=0.005)


def test_8b_split():
    # design.md: 8B = 6 x 7.505e9 = 45.03 GFLOP + attention causal 6.44 (6*32*32*128*8192 = 6.442e9)
    m = get_model("8b")
    assert attention_flops_per_token(m, 8192) == 6 * 32 * 32 * 128 * 8192
    assert 6 * m.num_params_without_embedding / 1e9 == pytest.approx(45.03, abs=0.005)
    # SwiGLU MLP alone: 6 * 32 * 3 * 4096 * 14336 = 33.82e9
    assert 6 * 32 * m.mlp_params_per_layer / 1e9 == pytest.approx(33.82, abs=0.005)


def test_mfu():
    # 1e15 FLOP in 1 s on 2 GPUs of 1000 TFLOP/s peak = 50%
    assert mfu(1e15, 1.0, 2, 1000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1e15, 0.0, 2, 1000)
