"""Where a warm teacher call spends its time (scripts/profile_teacher.py, docs/teacher_profile.md).

Three measurements per query size N, all on warm graphs after a ``context``-token prefill:

* ``kernels``: MindSpore's CPU profiler (``mindspore.profiler.profile``, activity CPU) records every
  launched kernel with its start and duration. Per call: the kernel count, the sum of kernel times, the
  span from the first kernel's start to the last kernel's end, and per component (``component``) the
  kernel count and time. span - kernel time is the runtime's own per-kernel dispatch cost.
* ``host``: the pieces of ``TeacherRunner._call`` timed separately: input Tensor creation, the Cell call,
  ``asnumpy`` of logits and aux; and the host mask build.
* ``floor``: a graph with the teacher's four inputs and two tiny outputs: the fixed cost of one call.

The profiler files are MindSpore's (FRAMEWORK/cpu_op_execute_timestamp_*.txt: one line per kernel,
``scope/name;HostCpuOps;start_ns,duration_ms,tid start_ns,duration_ms,tid ...``, one entry per launch).
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
import time
from collections import defaultdict

import numpy as np

from eagle_ms.bench.calls import _chain_tree
from eagle_ms.tree import tensorize, verify_attention_mask

# (component, regex on the kernel's scope name); first match wins. Scopes are Cell attribute paths, but
# MindSpore attributes the kernels of identical layers (compiled once, reused) and of expanded ops
# ("Expand/_SiLU/...") approximately, so a component is a coarse group, not an exact Cell.
COMPONENTS = (
    ("cache write (scatter)", r"ScatterUpdate"),
    ("cache window read", r"kv_cache"),
    ("attention (scores, softmax, probs.V)", r"BatchMatMul|Softmax|EagerAttention|FusedAttention|_Muls"),
    ("mlp", r"mlp-MLP|_SiLU"),
    ("q/k/v/o projections", r"qkv_proj-FusedLinear|o_proj-Linear"),
    ("rms norms", r"RMSNorm"),
    ("rope + head layout", r"rotary-Rotary|self_attn-CachedAttention/"),
    ("residual adds", r"DecoderLayer/Add"),
    ("lm_head", r"^Default/(lm_head-Linear/)?MatMul"),
    ("embedding", r"^Default/Gather"),
    ("other", r""),
)


def component(scope: str) -> str:
    """The component of one kernel, from its scope name (``COMPONENTS``, first match).

    Example: 'Default/model-PanguModel/layers-CellList/3-DecoderLayer/mlp-MLP/gate_up_proj-FusedLinear/MatMul-op9'
    -> 'mlp'.
    """
    for name, pattern in COMPONENTS:
        if re.search(pattern, scope):
            return name
    raise AssertionError("the last component matches everything")


def op_type(scope: str) -> str:
    """The kernel type from its scope name. Example: '.../up_proj-Linear/MatMul-op9' -> 'MatMul'."""
    return re.sub(r"-op\d+$", "", scope.rsplit("/", 1)[-1])


def read_kernel_records(profile_dir: str) -> dict[str, list[tuple[float, float]]]:
    """{kernel scope name: [(start_ms, duration_ms) per launch]} from one profiler output directory."""
    files = glob.glob(os.path.join(profile_dir, "**", "cpu_op_execute_timestamp_*.txt"), recursive=True)
    if not files:
        raise FileNotFoundError(f"no cpu_op_execute_timestamp_*.txt under {profile_dir}: the profiler wrote nothing")
    out: dict[str, list[tuple[float, float]]] = {}
    for path in files:
        for line in open(path, encoding="utf-8"):
            parts = line.strip().split(";")
            if len(parts) < 3:
                continue
            launches = [item.split(",") for item in parts[2].split()]
            out[parts[0]] = [(int(s) / 1e6, float(d)) for s, d, *_ in launches]
    return out


def summarize_calls(records: dict[str, list[tuple[float, float]]], calls: int) -> dict:
    """Robust per-call figures from the records of ``calls`` identical graph calls (each kernel is
    launched once per call, so a kernel's i-th launch belongs to call i).

    ``kernel_ms`` is the sum over kernels of each kernel's median duration; ``span_ms`` the median span
    of a call; ``dispatch_ms`` their difference. ``components`` / ``op_types``: {name: {"kernels", "ms"}}
    (same medians), slowest first.
    """
    bad = {name: len(v) for name, v in records.items() if len(v) != calls}
    if bad:
        raise ValueError(f"kernels not launched once per call ({calls} calls): {dict(list(bad.items())[:5])}")
    spans = []
    for i in range(calls):
        starts = [v[i][0] for v in records.values()]
        ends = [v[i][0] + v[i][1] for v in records.values()]
        spans.append(max(ends) - min(starts))
    medians = {name: float(np.median([d for _, d in launches])) for name, launches in records.items()}
    comps: dict[str, dict] = defaultdict(lambda: {"kernels": 0, "ms": 0.0})
    ops_: dict[str, dict] = defaultdict(lambda: {"kernels": 0, "ms": 0.0})
    for name, ms in medians.items():
        for table, key in ((comps, component(name)), (ops_, op_type(name))):
            table[key]["kernels"] += 1
            table[key]["ms"] += ms
    kernel_ms, span_ms = sum(medians.values()), float(np.median(spans))
    return {"kernels": len(records), "kernel_ms": kernel_ms, "span_ms": span_ms, "dispatch_ms": span_ms - kernel_ms,
            "components": _by_time(comps), "op_types": _by_time(ops_)}


def _by_time(table: dict) -> dict:
    return dict(sorted(table.items(), key=lambda kv: -kv[1]["ms"]))


def _verify_args(runner, tree_tensors):
    """The four host arrays ``TeacherRunner.verify`` hands ``_call`` for these tree tensors."""
    width = runner.attention_width(runner.length + tree_tensors.num_nodes)
    return (tree_tensors.tokens, tree_tensors.position_ids, tree_tensors.cache_slots,
            verify_attention_mask(tree_tensors, width))


def profile_call(call, calls: int) -> dict:
    """``summarize_calls`` of ``calls`` runs of ``call()`` (one warm graph call that waits for its result)
    under MindSpore's CPU profiler; one untimed call first."""
    import mindspore as ms
    from mindspore.profiler import ProfilerActivity

    call()
    with tempfile.TemporaryDirectory(prefix="eagle_ms_profile_") as out:
        prof = ms.profiler.profile(activities=[ProfilerActivity.CPU],
                                   schedule=ms.profiler.schedule(wait=0, warmup=0, active=calls, repeat=1),
                                   on_trace_ready=ms.profiler.tensorboard_trace_handler(out))
        prof.start()
        for _ in range(calls):
            call()
            prof.step()
        prof.stop()
        return summarize_calls(read_kernel_records(out), calls)


def profile_kernels(runner, tree_tensors, calls: int) -> dict:
    """Profile ``calls`` warm verify calls of one tree with MindSpore's CPU profiler (see module doc)."""
    args = _verify_args(runner, tree_tensors)
    return profile_call(lambda: runner._call(*args), calls)


def time_host_parts(runner, tree_tensors, repeats: int) -> dict:
    """Median ms of the pieces of one verify call: mask build, Tensor creation, Cell call, asnumpy."""
    from mindspore import Tensor

    parts = defaultdict(list)
    for _ in range(repeats):
        t0 = time.perf_counter()
        ids, pos, slots, allowed = _verify_args(runner, tree_tensors)
        t1 = time.perf_counter()
        inputs = (Tensor(ids[None].astype(np.int32)), Tensor(pos[None].astype(np.int32)),
                  Tensor(slots[None].astype(np.int32)), Tensor(allowed[None]))
        t2 = time.perf_counter()
        logits, aux = runner.model(*inputs)
        logits.asnumpy()
        t3 = time.perf_counter()
        aux.asnumpy()
        t4 = time.perf_counter()
        for key, dt in (("mask_build", t1 - t0), ("tensor_creation", t2 - t1), ("cell_call_with_logits_copy", t3 - t2),
                        ("aux_copy", t4 - t3)):
            parts[key].append(dt)
    return {k: 1e3 * float(np.median(v)) for k, v in parts.items()}


def _floor_cell():
    """A Cell taking the teacher's four inputs and returning two tiny outputs (built lazily: imports ms)."""
    import mindspore as ms
    from mindspore import nn, ops

    class Floor(nn.Cell):
        def construct(self, input_ids, position_ids, cache_slots, attn_mask):
            return ops.cast(input_ids, ms.float32), attn_mask

    return Floor()


def time_floor(n: int, width: int, repeats: int) -> float:
    """Median ms of a call of a graph with the teacher's four inputs (N tokens, mask width) doing nothing."""
    from mindspore import Tensor

    cell = _floor_cell()
    z = Tensor(np.zeros((1, n), np.int32))
    mask = Tensor(np.ones((1, n, width), bool))
    t = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        out = cell(z, z, z, mask)
        out[0].asnumpy()
        out[1].asnumpy()
        if i >= 2:
            t.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(t))


def profile_teacher(runner, sizes, calls: int = 10, repeats: int = 20, context: int = 256, seed: int = 0) -> dict:
    """{N: {"width", "kernels": summarize_calls(...), "host": time_host_parts(...), "floor_ms"}} per N."""
    rng = np.random.default_rng(seed)
    vocab = runner.model.config.vocab_size
    prompt = rng.integers(0, vocab, context).astype(np.int32)
    runner.prefill(prompt)
    out = {}
    for n in sizes:
        tree = tensorize(_chain_tree(int(prompt[-1]), n, vocab, rng), runner.length, n - 1, max(n - 1, 1))
        width = runner.attention_width(runner.length + n)
        out[n] = {"width": width, "kernels": profile_kernels(runner, tree, calls),
                  "host": time_host_parts(runner, tree, repeats), "floor_ms": time_floor(n, width, repeats)}
    return out
