"""The profile parser of eagle_ms/bench/graph_profile.py on hand-written profiler records (no MindSpore run).

Expected numbers are computed by hand from the literals below.
"""
import pytest

from eagle_ms.bench.graph_profile import component, op_type, read_kernel_records, summarize_calls

LAYER = "Default/model-PanguModel/layers-CellList/3-DecoderLayer/"


@pytest.mark.parametrize("scope, expected", [
    (LAYER + "mlp-MLP/gate_up_proj-FusedLinear/MatMul-op9", "mlp"),
    (LAYER + "self_attn-CachedAttention/qkv_proj-FusedLinear/Add-op2", "q/k/v/o projections"),
    (LAYER + "self_attn-CachedAttention/o_proj-Linear/MatMul-op1", "q/k/v/o projections"),
    (LAYER + "self_attn-CachedAttention/StridedSlice-op3", "rope + head layout"),
    (LAYER + "self_attn-CachedAttention/kv_cache-KVCache/ScatterUpdate-op1", "cache write (scatter)"),
    (LAYER + "self_attn-CachedAttention/kv_cache-KVCache/Gather-op4", "cache window read"),
    (LAYER + "self_attn-CachedAttention/attn-EagerAttention/BatchMatMul-op0", "attention (scores, softmax, probs.V)"),
    (LAYER + "self_attn-CachedAttention/ReverseV2-op3", "rope + head layout"),
    (LAYER + "input_layernorm-RMSNorm/Rsqrt-op0", "rms norms"),
    (LAYER + "Add-op7", "residual adds"),
    ("Default/MatMul-op0", "lm_head"),
    ("Default/lm_head-Linear/MatMul-op0", "lm_head"),
    ("Default/Gather-op0", "embedding"),
    ("Default/Concat-op5", "other"),
])
def test_component_of_scope(scope, expected):
    assert component(scope) == expected


def test_op_type():
    assert op_type(LAYER + "mlp-MLP/up_proj-Linear/MatMul-op9") == "MatMul"
    assert op_type("Expand/_SiLU/Sigmoid") == "Sigmoid"


def _write(tmp_path, lines):
    sub = tmp_path / "vm_1_ascend_ms" / "FRAMEWORK"
    sub.mkdir(parents=True)
    (sub / "cpu_op_execute_timestamp_0.txt").write_text("\n".join(lines) + "\n")


def test_records_and_summary_by_hand(tmp_path):
    # two calls; starts in ns, durations in ms
    _write(tmp_path, [
        "Default/MatMul-op0;HostCpuOps;1000000,0.5,0 11000000,0.7,0",       # call 1: 1.0-1.5 ms; call 2: 11.0-11.7
        LAYER + "mlp-MLP/Mul-op1;HostCpuOps;2000000,0.25,0 12000000,0.25,0",  # 2.0-2.25; 12.0-12.25
    ])
    records = read_kernel_records(str(tmp_path))
    assert records["Default/MatMul-op0"] == [(1.0, 0.5), (11.0, 0.7)]
    s = summarize_calls(records, 2)
    assert s["kernels"] == 2
    assert s["kernel_ms"] == pytest.approx(0.6 + 0.25)  # medians: (0.5+0.7)/2 and 0.25
    assert s["span_ms"] == pytest.approx(1.25)  # both calls span 1.25 ms
    assert s["dispatch_ms"] == pytest.approx(1.25 - 0.85)
    assert s["components"] == {"lm_head": {"kernels": 1, "ms": pytest.approx(0.6)},
                               "mlp": {"kernels": 1, "ms": pytest.approx(0.25)}}
    assert list(s["op_types"]) == ["MatMul", "Mul"]


def test_kernel_not_launched_once_per_call_is_refused(tmp_path):
    _write(tmp_path, ["Default/MatMul-op0;HostCpuOps;1000000,0.5,0"])
    with pytest.raises(ValueError, match="once per call"):
        summarize_calls(read_kernel_records(str(tmp_path)), 2)


def test_missing_profile_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="profiler wrote nothing"):
        read_kernel_records(str(tmp_path))
