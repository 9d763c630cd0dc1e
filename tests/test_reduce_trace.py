"""bench/engine_smoke/reduce_trace.py on a hand-made Chrome trace (values derived by hand below)."""

import importlib.util
from pathlib import Path

_P = Path(__file__).resolve().parents[1] / "bench" / "engine_smoke" / "reduce_trace.py"
_spec = importlib.util.spec_from_file_location("reduce_trace", _P)
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


def _x(events, cat, name, ts, dur, tid=1, **args):
    events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args})


def _trace():
    e = []
    _x(e, "user_annotation", "ProfilerStep#6", 0, 10_000)            # host step 0-10 ms on the main thread
    _x(e, "cpu_op", "aten::_grouped_mm", 100, 500)
    _x(e, "cuda_runtime", "cudaLaunchKernel", 200, 10, correlation=1)
    _x(e, "kernel", "cutlass_grouped_kernel", 1_000, 2_000, tid=7, correlation=1)     # 1-3 ms, forward
    # backward on the autograd thread (tid 2): an index_put_ under IndexBackward0
    _x(e, "cpu_op", "autograd::engine::evaluate_function: IndexBackward0", 3_000, 1_000, tid=2)
    _x(e, "cpu_op", "aten::_index_put_impl_", 3_100, 500, tid=2)
    _x(e, "cuda_runtime", "cudaLaunchKernel", 3_200, 10, tid=2, correlation=2)
    _x(e, "kernel", "indexing_backward_kernel", 5_000, 1_000, tid=7, correlation=2)   # 5-6 ms, after a 2 ms gap
    _x(e, "user_annotation", "Optimizer.step#AdamW.step", 7_000, 2_000)
    _x(e, "cpu_op", "aten::_fused_adamw_", 7_100, 500)
    _x(e, "cuda_runtime", "cudaLaunchKernel", 7_200, 10, correlation=3)
    _x(e, "kernel", "multi_tensor_apply_kernel", 5_500, 1_500, tid=7, correlation=3)  # 5.5-7 ms, overlaps the last
    return {"traceEvents": e}


def test_reduce_places_kernels_by_step_phase_and_category():
    s = rt.reduce(_trace())["steps"]["ProfilerStep#6"]
    # busy = union of [1,3], [5,6], [5.5,7] ms = 2 + 2 = 4 ms; sum = 2 + 1 + 1.5 = 4.5 ms; span 1-7 ms = 6 ms
    assert s["kernel_busy_ms"] == 4.0 and s["kernel_sum_ms"] == 4.5 and s["gpu_span_ms"] == 6.0
    # idle = host step 10 ms - busy 4 ms
    assert s["gpu_idle_in_host_step_ms"] == 6.0
    assert s["by_phase_ms"] == {"fwd": 2.0, "bwd": 1.0, "optim": 1.5}
    assert s["by_category_ms"] == {"grouped_gemm": 2.0, "optimizer_and_grad_norm": 1.5,
                                   "permute_index_gather_scatter": 1.0}
    # one gap over 0.5 ms: 3 -> 5 ms, before the backward index kernel
    assert s["gaps_over_0.5ms_count"] == 1 and s["gaps_over_0.5ms_top20"][0]["gap_ms"] == 2.0
    assert s["gaps_over_0.5ms_top20"][0]["next_phase"] == "bwd"


def test_category_rules():
    assert rt.category("triton_poi_fused__to_copy_3", "triton_poi_fused__to_copy_3", ()) == "dtype_conversion"
    assert rt.category("nvjet_sm90_tst_256x128", "aten::mm", ("aten::linear", "aten::mm")) == "dense_gemm"
    assert rt.category("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", "aten::_cudnn_attention_backward",
                       ("aten::_cudnn_attention_backward",)) == "attention"
    assert rt.category("ncclDevKernel_AllReduce", "", ()) == "nccl"
    assert rt.category("elementwise_kernel", "aten::mul", ("aten::mul",)) == "other_elementwise_reduction"
