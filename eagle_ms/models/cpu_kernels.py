"""Fused CPU kernels (RMSNorm, residual add + RMSNorm, the draft's embedding + input norms, SwiGLU, RoPE + head
split, masked softmax, attention over the cache window, the draft's log-softmax + top-K, the draft tree's
bookkeeping, the verify mask and greedy acceptance) as MindSpore ``ops.Custom`` AOT operators.

On MindSpore's CPU runtime every launched kernel costs a fixed 5-19 µs whatever it computes
(docs/teacher_profile.md §"The dispatch floor"), and the layers' norms, SwiGLU and RoPE are chains of
small elementwise kernels. ``cpu_kernels.cc`` (next to this file) does each chain in one kernel;
``tree_kernels.cc`` does the draft tree's bookkeeping (eagle_ms/models/tree_kernels.py) and
``verify_kernels.cc`` the verify graph's mask and greedy acceptance; all three build one library and share
the helpers of ``kernel_common.h``. The
layers use them when built with ``kernels="cpu"`` (``choose_kernels``); ``"composite"`` is the plain
MindSpore form, which training (no backward is defined for these operators), feature extraction and every
non-CPU device run; the kernels are checked against it and against NumPy in tests/test_cpu_kernels.py.

The library is compiled once per source version, compiler and CPU with the system C++ compiler (``CXX``,
else ``g++``; ``-march=native``) into ``$EAGLE_MS_KERNEL_DIR`` (default ``~/.cache/eagle_ms/kernels``),
written under a temporary name and renamed, so concurrent processes (msrun ranks) never load a
half-written file.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from eagle_ms.config import KERNELS
from eagle_ms.files import atomic_write

ENV_KERNEL_DIR = "EAGLE_MS_KERNEL_DIR"
_HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(_HERE, name) for name in (
    "cpu_kernels.cc", "tree_kernels.cc", "verify_kernels.cc", "draft_kernels.cc"))
HEADERS = tuple(os.path.join(_HERE, name) for name in ("kernel_common.h", "layer_math.h", "tree_math.h"))  # included by
# SOURCES; part of the library digest
# -fno-trapping-math lets selects vectorise (no FP exception is ever observed); no -ffast-math: the code
# itself decides the order of every sum
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-trapping-math")

_LIBRARY: dict[str, str] = {}  # compiler + source digest -> built library path (this process)


def choose_kernels(setting: str, device: str, compute_dtype: str) -> str:
    """'cpu' or 'composite' for the inference graphs of one run (both decode modes: the reference mode
    checks the graphs the performance mode runs).

    ``auto``: 'cpu' on the CPU with float32 compute, else 'composite'. ``cpu`` is an error where the kernels
    cannot run (another device or dtype).
    """
    if setting not in KERNELS:
        raise ValueError(f"config key 'runtime.kernels' = {setting!r}: must be one of {', '.join(KERNELS)}")
    usable = device == "CPU" and compute_dtype == "float32"
    if setting == "cpu" and not usable:
        raise ValueError(f"config key 'runtime.kernels' = 'cpu' needs device_target CPU and compute_dtype float32 "
                         f"(got {device}, {compute_dtype}); use 'auto' or 'composite'")
    return "cpu" if usable and setting != "composite" else "composite"


def library_path() -> str:
    """The compiled kernel library, building it on first use. RuntimeError (with the compiler's output)
    when no compiler is found or the build fails."""
    compiler = os.environ.get("CXX", "g++")
    source = b""
    for name in SOURCES + HEADERS:
        with open(name, "rb") as f:
            source += f.read()
    # -march=native: the library fits this CPU only, so its identity is part of the name (a home directory
    # shared by the nodes of a cluster keeps one library per CPU model)
    digest = hashlib.sha256(source + " ".join((compiler, _cpu_identity()) + FLAGS).encode()).hexdigest()[:16]
    if digest in _LIBRARY:
        return _LIBRARY[digest]
    folder = os.environ.get(ENV_KERNEL_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "eagle_ms", "kernels")
    path = os.path.join(folder, f"cpu_kernels-{digest}.so")
    if not os.path.exists(path):
        _build(compiler, folder, path)
    _LIBRARY[digest] = path
    return path


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (Linux ``/proc/cpuinfo``; the machine type elsewhere)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.machine()


def _build(compiler: str, folder: str, path: str) -> None:
    """Compile into a private temp file, then publish it at ``path`` with ``files.atomic_write``."""
    if shutil.which(compiler) is None:
        raise RuntimeError(f"runtime.kernels 'cpu' needs a C++ compiler: {compiler!r} was not found (set CXX, "
                           f"install g++, or set runtime.kernels to 'composite')")
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = os.path.join(scratch, "cpu_kernels.so")
        done = subprocess.run([compiler, *FLAGS, "-o", built, *SOURCES], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {' and '.join(SOURCES)} with {compiler} failed:\n{done.stderr.strip()}")
        with open(built, "rb") as f:
            library = f.read()
    atomic_write(path, lambda handle: handle.write(library), binary=True)


def _custom(function: str, out_shape, out_dtype):
    from mindspore import ops

    return ops.Custom(f"{library_path()}:{function}", out_shape=out_shape, out_dtype=out_dtype, func_type="aot")


def rms_norm_op():
    """(x [..., H], w [H], eps [1]) -> y like x: RMSNorm per row."""
    return _custom("RmsNorm", lambda x, w, eps: x, lambda x, w, eps: x)


def add_rms_norm_op():
    """(x [..., H], a [..., H], bias [H], w [H], eps [1]) -> (s = x + (a + bias), RmsNorm(s) with w)."""
    return _custom("AddRmsNorm", lambda x, a, bias, w, eps: (x, x), lambda x, a, bias, w, eps: (x, x))


def embed_pair_norm_op():
    """(table [V,H], ids [B,N] i32, feature [B,N,H], w_embed [H], w_feature [H], eps [1]) -> [B,N,2H]:
    RmsNorm(table[ids]) with w_embed, then RmsNorm(feature) with w_feature, per row."""
    return _custom("EmbedPairNorm", lambda table, ids, f, w1, w2, eps: [*f[:-1], 2 * f[-1]],
                   lambda table, ids, f, w1, w2, eps: f)


def masked_softmax_op():
    """(scores [B,Hkv,G*N,S], additive mask of B*N*S values ([B,1,1,N,S]), scale [1]) -> softmax over S of
    scores*scale + mask, like scores; score row g*N + n takes mask row n."""
    return _custom("MaskedSoftmax", lambda scores, mask, scale: scores, lambda scores, mask, scale: scores)


def window_attention_op():
    """(q [B,Hq,N,D], k_cache [B*Hkv*S,D], v_cache [B*Hkv*S,D], keep [B,N,W] bool, scale [Hkv]) -> out
    [B,N,Hq*D]: attention over cache slots [0, W) read in place (``kv_cache``'s flat layout); slots with keep
    False dropped exactly."""
    return _custom("WindowAttention", lambda q, k, v, mask, scale: [q[0], q[2], q[1] * q[3]],
                   lambda q, k, v, mask, scale: q)


def log_softmax_top_k_op(top_k: int):
    """(logits [..., Vd] f32, d2t [Vd] i32) -> (top-K log-softmax values [..., K] f32 descending, equal logits
    lower index first; their target ids index + d2t[index] [..., K] i32)."""
    import mindspore as ms

    return _custom("LogSoftmaxTopK", lambda x, d2t: ([*x[:-1], top_k], [*x[:-1], top_k]),
                   lambda x, d2t: (ms.float32, ms.int32))


def silu_mul_op():
    """gate_up [..., 2I] -> silu(gate) * up [..., I]."""
    return _custom("SiluMul", lambda gu: list(gu[:-1]) + [gu[-1] // 2], lambda gu: gu)


def rope_split_op(num_heads: int, num_kv_heads: int):
    """(qkv [B,N,Hq+2Hkv,D], bias [(Hq+2Hkv)*D], cos [B,Nc,D], sin [B,Nc,D]) -> (q [B,Hq,N,D], k [B,N,Hkv,D],
    v [B,N,Hkv,D]): bias added, q and k rotated (``layers.Rotary``'s signed sin), v copied; Nc = N or 1."""
    def shapes(qkv, bias, cos, sin):
        b, n, _, d = qkv
        return ([b, num_heads, n, d], [b, n, num_kv_heads, d], [b, n, num_kv_heads, d])

    return _custom("RopeSplit", shapes, lambda qkv, bias, cos, sin: (qkv, qkv, qkv))


def tree_start_op():
    """(root_logprob [B,K] f32, root_ids [B,K] i32, layout [k,C] i32 (shape only)) -> the candidate tables after
    depth 1 (scores [B,C] f32, ints [B,3,C] i32) and the frontier (scores [B,k] f32, ids [B,k] i32, tokens
    [B,k] i32). Sizes travel in input shapes: MindSpore caches inferred output shapes by input shapes."""
    import mindspore as ms

    def shapes(lp, ids, layout):
        b, (k, c) = lp[0], layout
        return [b, c], [b, 3, c], [b, k], [b, k], [b, k]

    return _custom("TreeStart", shapes, lambda *_: (ms.float32, ms.int32, ms.float32, ms.int32, ms.int32))


def tree_grow_op():
    """(scores [B,C], ints [B,3,C], front_scores [B,k], front_ids [B,k], logprob [B,k,K], target_ids [B,k,K],
    first [1] i32, cut [1] f32) -> (scores, ints, front_scores, front_ids, front_tokens [B,k] i32,
    parent_rows [B,k] i32): one expansion depth (tree_kernels.cc ``TreeGrow``)."""
    import mindspore as ms

    def shapes(s, ints, fs, fid, lp, ids, first, cut):
        return s, ints, fs, fid, fid, fid

    return _custom("TreeGrow", shapes, lambda *_: (ms.float32, ms.int32, ms.float32, ms.int32, ms.int32, ms.int32))


def extend_inputs_op():
    """(result [B,2D+3] i32, committed_len [B] i32, settings [3] i32 (scratch X, capacity S, context window or 0),
    columns [X+W] i32 and heads [Hkv] i32 (shapes only)) -> (ids, positions [B,D+1] i32, flat cache rows
    [B*(D+1)*Hkv] i32, allowed [B,D+1,X+W] bool, A [B] i32, real rows max(A+1, 0) [B] i32, L' = L + A + 1 [B]
    i32): the draft extend's rows (tree_kernels.cc ``ExtendInputs``)."""
    import mindspore as ms

    def shapes(result, length, settings, columns, heads):
        rows = [result[0], (result[1] - 1) // 2]
        batch = [result[0]]
        return rows, rows, [rows[0] * rows[1] * heads[0]], rows + [columns[0]], batch, batch, batch

    return _custom("ExtendInputs", shapes, lambda *_: (ms.int32, ms.int32, ms.int32, ms.bool_, ms.int32, ms.int32,
                                                       ms.int32))


def root_pair_op():
    """(result [B,2D+3] i32, logprob [B,D+1,K] f32, target_ids [B,D+1,K] i32, hidden [B,D+1,H] f32, then the
    stored token [B], logprob [B,K], target_ids [B,K], hidden [B,H]) -> the new root pair (token, logprob,
    target_ids, hidden): extend row A's, or the stored one when A = -1, also written over the stored pair in
    place (tree_kernels.cc ``RootPair``)."""
    return _custom("RootPair", lambda result, lp, ids, hid, t, slp, sids, shid: (t, slp, sids, shid),
                   lambda result, lp, ids, hid, t, slp, sids, shid: (t, slp, sids, shid))


def tree_finish_op():
    """(scores [B,C], ints [B,3,C], root_token [B] i32, committed_len [B] i32, layout [D+1,N] i32 (shape
    only)) -> the 12 tree tensors of ``TreeGrowth.finish`` (N = M + 1, P = M; tree_kernels.cc
    ``TreeFinish``)."""
    import mindspore as ms

    def shapes(s, ints, root, length, layout):
        b, (levels, n) = s[0], layout
        return ([b, n], [b, n], [b, n], [b, n], [b, levels, n], [b, n], [b, n], [b, n, n], [b, n - 1, levels],
                [b, n - 1], [b], [b, n])

    i32, flag = ms.int32, ms.bool_
    return _custom("TreeFinish", shapes, lambda *_: (i32, i32, i32, flag, i32, i32, i32, flag, i32, i32, i32,
                                                     ms.float32))


def draft_front_op():
    """(ids [B,n] i32, features [B,n,H], positions [B,n] i32, inv_freq [Dh/2] (``layers.Rotary``'s), real [B] i32,
    then ``Eagle3Draft.kernel_weights()``) -> (q [B,n,Hq,Dh], k [B,n,Hkv,Dh], v [B,n,Hkv,Dh]): the draft layer
    up to attention over the first real[b] rows, RoPE tables made in the kernel (draft_kernels.cc
    ``DraftFront``)."""
    import mindspore as ms

    def shapes(ids, feats, positions, inv_freq, real, *weights):
        b, n = ids
        hkv, d = weights[-1][0], 2 * inv_freq[0]
        return [b, n, weights[3][1] // d - 2 * hkv, d], [b, n, hkv, d], [b, n, hkv, d]

    return _custom("DraftFront", shapes, lambda *_: (ms.float32,) * 3)


def draft_extend_front_op():
    """(ids [B,n] i32, aux [B,n,3Ht], positions, inv_freq, real [B] i32, fc [3Ht,H], then the weights) ->
    ``DraftFront``'s outputs and features [B,n,H] (fc of the real rows): the extend call's first kernel
    (``DraftExtendFront``)."""
    import mindspore as ms

    def shapes(ids, aux, positions, inv_freq, real, fc, *weights):
        b, n = ids
        hkv, d = weights[-1][0], 2 * inv_freq[0]
        return [b, n, weights[3][1] // d - 2 * hkv, d], [b, n, hkv, d], [b, n, hkv, d], [b, n, fc[1]]

    return _custom("DraftExtendFront", shapes, lambda *_: (ms.float32,) * 4)


def draft_back_op(top_k: int):
    """(q [B,n,Hq,Dh], features [B,n,H], keep [B,n,W] bool, real [B] i32, first [B] i32, k_cache [B*Hkv*S,Dh],
    v_cache, then the weights) -> (top-K logprob [B,n,K], target ids [B,n,K] i32, hidden [B,n,H]): the draft
    layer from attention on for rows [first, real), over the cache after the rows' K/V were written
    (draft_kernels.cc ``DraftBack``)."""
    import mindspore as ms

    def shapes(q, feats, keep, real, first, k_cache, v_cache, *weights):
        return [q[0], q[1], top_k], [q[0], q[1], top_k], list(feats)

    return _custom("DraftBack", shapes, lambda *_: (ms.float32, ms.int32, ms.float32))


def draft_tree_op():
    """(root_logprob [B,K], root_ids [B,K] i32, root_hidden [B,H], length [B] i32, inv_freq [Dh/2], k_cache,
    v_cache, settings [3] i32 (scratch X, context window or 0, budget M), cut [1] f32, layout [k,C] i32 (shape
    only), then ``Eagle3Draft.kernel_weights()``) -> the candidate tables (scores [B,C] f32, ints [B,3,C] i32)
    after every expansion depth, or the exact early stop (draft_kernels.cc ``DraftTree``)."""
    import mindspore as ms

    def shapes(lp, ids, hidden, length, inv_freq, kc, vc, settings, cut, layout, *weights):
        return [lp[0], layout[1]], [lp[0], 3, layout[1]]

    return _custom("DraftTree", shapes, lambda *_: (ms.float32, ms.int32))


def verify_mask_op():
    """(committed_len [B] i32, tree_mask [B,N,N] bool, layout [W] i32 (shape only)) -> allowed [B,N,W] bool:
    slots [0, L) and the tree's branch L + j (verify_kernels.cc ``VerifyMask``)."""
    import mindspore as ms

    return _custom("VerifyMask", lambda length, mask, layout: [mask[0], mask[1], layout[0]],
                   lambda length, mask, layout: ms.bool_)


def greedy_accept_op():
    """(tokens [B,N] i32, argmax [B,N] i32, paths [B,P,D+1] i32, path_lengths [B,P] i32, committed_len [B] i32,
    cache_shape [2] i32 = (Hkv, S), *caches [B*Hkv*S, Dh] f32) -> (packed result [B,2D+3] i32, aux_rows
    [B*(D+1)] i32): greedy acceptance, and the commit by path done in place in the given caches
    (verify_kernels.cc ``GreedyAccept``; no caches: acceptance only)."""
    def shapes(tokens, argmax, paths, lengths, length, cache_shape, *caches):
        return [paths[0], 2 * paths[2] + 1], [paths[0] * paths[2]]

    return _custom("GreedyAccept", shapes, lambda tokens, *_: (tokens, tokens))
