"""The device step's graphs under MindSpore's CPU profiler (eagle_ms/bench/device_profile.py), on the shipped
demo pair with a small tree (budget 8, depth 4, window 256) so that it compiles quickly.

Structural facts of the compiled graphs, each the guard of a change in docs/teacher_profile.md §"Device
step graphs": no whole-cache snapshot (TensorMove) in the draft tree graph, whose depths write the same
cache Parameter; no K/V or query transposes (only the output's per layer at N > 1, with the fused CPU
kernels); five fused kernels per teacher layer; a profile that launches every kernel once per call.
"""
import os

import pytest

from conftest import REPO
from eagle_ms.bench.device_profile import GRAPHS, profile_device_step
from eagle_ms.config import load_config
from eagle_ms.runtime import kernels_for, setup_context
from eagle_ms.session import Session

DEMO_YAML = os.path.join(REPO, "configs", "demo.yaml")


@pytest.fixture(scope="module")
def profile():
    cfg = load_config(DEMO_YAML, {"speculative.step": "device", "speculative.budget": 8,
                                  "speculative.max_depth": 4, "runtime.seq_length": 512,
                                  "runtime.attention_windows": [256]})
    setup_context(cfg)
    return cfg, profile_device_step(Session(cfg), context=64, calls=2)


def test_every_graph_is_profiled(profile):
    _, res = profile
    assert tuple(res) == GRAPHS
    for name, k in res.items():
        assert k["kernels"] == sum(c["kernels"] for c in k["op_types"].values()) > 0, name
    assert res["draft_step"]["kernels"] > res["draft_tree"]["kernels"]  # the extend comes on top


def test_draft_graphs_never_snapshot_the_cache(profile):
    _, res = profile
    for name in ("draft_tree", "draft_step"):
        assert "TensorMove" not in res[name]["op_types"], name


def test_verify_graph_reads_the_cache_in_place_and_transposes_nothing(profile):
    """With the fused CPU kernels (the default here) RopeSplit writes q head-major and WindowAttention reads
    the cache window in place and writes its output row-major: no transpose and no window gather is left
    (the only Gathers are the embedding lookup and the tree's own index gathers, none per layer)."""
    cfg, res = profile
    ops = res["verify"]["op_types"]
    assert kernels_for(cfg) == "cpu"
    assert "Transpose" not in ops
    assert ops.get("Gather", {"kernels": 0})["kernels"] < cfg.model.num_hidden_layers


def test_each_teacher_layer_runs_five_fused_kernels(profile):
    """RmsNorm, RopeSplit, WindowAttention, AddRmsNorm and SiluMul per layer, plus the final norm
    (eagle_ms/models/cpu_kernels.py) and the verify step's mask and acceptance kernels
    (eagle_ms/models/verify_kernels.cc); none of the composite chains they replace is left."""
    cfg, res = profile
    ops = res["verify"]["op_types"]
    assert ops["Custom"]["kernels"] == 5 * cfg.model.num_hidden_layers + 1 + 2  # + VerifyMask, GreedyAccept
    assert not {"Softmax", "Rsqrt", "SiLU", "ReduceMean", "BatchMatMul"} & set(ops)


def test_draft_tree_bookkeeping_is_one_kernel_per_depth(profile):
    """With the fused CPU kernels the tree's growth, rerank and tensors are TreeStart, one TreeGrow per
    expansion depth and TreeFinish (eagle_ms/models/tree_kernels.py): none of the composite form's
    pairwise-ranking, cumulative-sum or any-reductions is left in the draft tree graph."""
    _, res = profile
    ops = res["draft_tree"]["op_types"]
    assert not {"CumSum", "ReduceAny", "ReduceSum", "FloorDiv", "GatherD", "Equal", "Select"} & set(ops), {o: c["kernels"] for o, c in ops.items()}


def test_verify_mask_and_acceptance_are_one_kernel_each(profile):
    """VerifyMask and GreedyAccept (eagle_ms/models/verify_kernels.cc) replace the composite mask and
    acceptance: no cumulative sum, min / max reduction or logical chain is left in the verify graph."""
    _, res = profile
    ops = res["verify"]["op_types"]
    assert not {"CumSum", "ReduceMin", "ReduceMax", "LogicalOr", "LogicalAnd", "LogicalNot"} & set(ops), \
        {o: c["kernels"] for o, c in ops.items()}
