"""autotune.runtime.trace: kernel categories and busy-time arithmetic (pure functions, no GPU)."""

import pytest

from autotune.runtime.trace import _union_ms, categorize


@pytest.mark.parametrize("name, cat", [
    # kernel names as they appear in a torch.profiler trace on H200 (torch 2.11, CUDA 13)
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
    ("void at::native::multi_tensor_apply_kernel<TensorListMetadata<2>, CopyFunctor>", "optimizer"),
    ("void at::native::cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>", "cross_entropy"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>", "cast_copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("aten::mm", "gemm"),                 # CPU runs categorize ATen operators
    ("something_unknown", "other"),
])
def test_categorize(name, cat):
    assert categorize(name) == cat


def test_union_of_intervals():
    # [0, 1000) and [500, 2000) overlap -> [0, 2000) = 2000 us; [3000, 4000) adds 1000 us -> 3.0 ms
    assert _union_ms([(3000, 4000), (0, 1000), (500, 2000)]) == 3.0
    assert _union_ms([]) == 0.0
