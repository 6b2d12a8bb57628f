"""The device verify graph (eagle_ms/models/verify_step.py) and its host driver (eagle_ms/device_verify.py).

Second implementations: the host path of today's loop (TeacherRunner.verify + verify.greedy_accept +
BranchCache.commit_by_path) on the same teacher (cache snapshot / restore between the two), the host
tree.verify_attention_mask, sequential one-token decoding of the committed
tokens (commit equivalence), teacher-only ``generate``, and hand-computed literals.
"""
import dataclasses

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

import eagle_ms.models.attention as attention
from eagle_ms.cache import path_move_slots
from eagle_ms.device_verify import DeviceAcceptMismatch, DeviceVerifier, TreeInputs, _check_against_host
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.host_step import redecoded_rows
from eagle_ms.models import cpu_kernels
from eagle_ms.models.step_result import (StepResult, pack_result_numpy, result_width, unpack_result)
from eagle_ms.models.verify_step import DecodeStep, DeviceAccept, VerifyStep, verify_mask
from eagle_ms.oracle_drafter import OracleDrafter
from eagle_ms.teacher import TeacherRunner
from eagle_ms.tree import DraftTree, tensorize, verify_attention_mask
from eagle_ms.verify import greedy_accept
from helpers_models import TINY, binary_parents, build_teacher, make_tree, prompt, random_parents, rel_err
from test_attention_backends import FakeFlash

CAPACITY = 64
WINDOWS = (32,)  # + CAPACITY
BUDGET, MAX_DEPTH = 8, 4
N = BUDGET + 1
AUX = 3 * TINY.hidden_size
CHAIN_STAR = [0, 1, 2, 3, 0, 0, 0, 0]  # nodes 1..4 a chain, 5..8 children of the root


def _device(kernels):
    model, _ = build_teacher(CAPACITY, seed=11, kernels=kernels)
    runner = TeacherRunner(model, 8, MAX_DEPTH + 1, attention_windows=WINDOWS)
    verifier = DeviceVerifier(runner, MAX_DEPTH)
    verifier.warm_up([1, N])
    return runner, verifier, compile_counts(verifier)


@pytest.fixture(scope="module")
def device():
    """One teacher, its host runner and a warmed performance-mode DeviceVerifier over the same cache
    (composite layers: the host commits an out-of-order path with the CacheMover graph)."""
    return _device("composite")


@pytest.fixture(scope="module")
def device_kernels():
    """The same with the fused CPU kernels: the verify graph commits out-of-order paths itself
    (``GreedyAccept`` moves the K/V rows in place); the host path it is compared with uses the CacheMover."""
    return _device("cpu")


def compile_counts(verifier) -> dict:
    """Compiled graphs per (kind, key) of a DeviceVerifier: its VerifySteps (key (window, N)) and DecodeSteps
    (key window)."""
    cells = [("verify", verifier.steps), ("decode", verifier.decode_steps)]
    return {(kind, w): len(cell.compile_cache) for kind, steps in cells for w, cell in steps.items()}


def _empty(root):
    return DraftTree(root, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))


# ------------------------------------------------------------------------------ packed result

def test_packed_result_worked_example():
    assert result_width(3) == 9
    row = np.array([[1, 17, 5, 0, 0, 0, 2, 0, 0]], np.int32)
    (r,) = unpack_result(row)
    assert r.accepted_len == 1 and r.tokens.tolist() == [17, 5] and r.node_ids.tolist() == [0, 2]
    a, tokens, node_ids = r  # the contract's tuple form
    np.testing.assert_array_equal(pack_result_numpy([StepResult(a, tokens, node_ids)], 3), row)
    none = pack_result_numpy([StepResult(-1, [], []), StepResult(3, [1, 2, 3, 4], [0, 1, 2, 3])], 3)
    assert none[0].tolist() == [-1] + [0] * 8 and none[1].tolist() == [3, 1, 2, 3, 4, 0, 1, 2, 3]
    first, second = unpack_result(none)
    assert first.accepted_len == -1 and first.tokens.size == 0 and first.node_ids.size == 0
    assert second.accepted_len == 3 and second.tokens.tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("bad, match", [
    (np.zeros((9,), np.int32), "shape"), (np.zeros((1, 8), np.int32), "shape"),
    (np.zeros((1, 9), np.float32), "dtype"), (np.array([[4, 0, 0, 0, 0, 0, 0, 0, 0]]), "A = 4"),
    (np.array([[-2, 0, 0, 0, 0, 0, 0, 0, 0]]), "A = -2"), (np.array([[1, 5, 6, 0, 0, 3, 2, 0, 0]]), "root 0"),
])
def test_unpack_names_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        unpack_result(bad)


def test_pack_names_bad_input():
    with pytest.raises(ValueError, match="step result 0: A = 1"):
        pack_result_numpy([StepResult(1, [5], [0])], 3)
    with pytest.raises(ValueError, match="A = 4"):
        pack_result_numpy([StepResult(4, [1] * 5, [0] * 5)], 3)
    with pytest.raises(ValueError, match="max_depth"):
        result_width(0)


# ------------------------------------------------------------------------------ acceptance (standalone Cell)

def test_device_accept_worked_example():
    """The worked example of DeviceAccept / greedy_accept: A = 2 on path row 1."""
    t = tensorize(make_tree(3, [7, 8, 9], [0, 0, 1]), 0, 3, 2)
    assert t.paths[:2].tolist() == [[0, 2, 2], [0, 1, 3]]
    out = DeviceAccept(2)(*[Tensor(x[None]) for x in (t.tokens, np.array([7, 9, 5, 4], np.int32), t.paths,
                                                      t.path_lengths)])
    a, emitted, node_ids = (x.asnumpy()[0] for x in out)
    assert int(a) == 2 and emitted.tolist() == [7, 9, 4] and node_ids.tolist() == [0, 1, 3]


def _parents(rng, m, depth, chain):
    """Random parent-before-child tree of m nodes of depth <= ``depth``; ``chain``: nodes 1..depth chained."""
    depths, parents = [0], []
    for k in range(1, m + 1):
        p = k - 1 if chain and k <= depth else int(rng.choice([j for j in range(k) if depths[j] < depth]))
        parents.append(p)
        depths.append(depths[p] + 1)
    return parents


def _crafted_batch(rng, batch, budget, depth, vocab):
    """Random trees (every other one with a depth-``depth`` chain) and argmax tables aimed at a uniformly
    drawn accept length along a random path (the table is random elsewhere: other paths may do better)."""
    trees, tables = [], []
    for b in range(batch):
        m = budget if b % 2 == 0 else int(rng.integers(0, budget + 1))
        t = tensorize(make_tree(1, rng.integers(0, vocab, m), _parents(rng, m, depth, b % 2 == 0)), 0, budget, depth)
        table = rng.integers(0, vocab, budget + 1)
        row = int(rng.integers(0, t.num_paths))
        path, length = t.paths[row], int(t.path_lengths[row])
        aim = int(rng.integers(0, length))                  # accept this many drafts along this path
        table[path[:aim]] = t.tokens[path[1:aim + 1]]
        if aim + 1 < length:
            table[path[aim]] = (t.tokens[path[aim + 1]] + 1) % vocab
        trees.append(t)
        tables.append(table.astype(np.int32))
    return trees, np.stack(tables)


def test_device_accept_equals_greedy_accept_on_crafted_tables():
    """64 trees in one batched call (B = 64): every accept length 0..D occurs, ties across paths too."""
    rng = np.random.default_rng(0)
    budget, depth = 12, 5
    trees, tables = _crafted_batch(rng, 64, budget, depth, vocab=3)  # 3 tokens: many sibling ties
    stack = [np.stack([getattr(t, f) for t in trees]) for f in ("tokens", "paths", "path_lengths")]
    out = DeviceAccept(depth)(Tensor(stack[0]), Tensor(tables), Tensor(stack[1]), Tensor(stack[2]))
    a, emitted, node_ids = (x.asnumpy() for x in out)
    lengths, tie_broken = set(), 0
    for b, t in enumerate(trees):
        host = greedy_accept(t, tables[b])
        k = host.accepted_len
        assert int(a[b]) == k, b
        assert node_ids[b, :k + 1].tolist() == host.node_ids.tolist() and not node_ids[b, k + 1:].any()
        assert emitted[b, :k + 1].tolist() == host.tokens.tolist() and not emitted[b, k + 1:].any()
        lengths.add(k)
        per_path = [greedy_accept(dataclasses.replace(t, paths=t.paths[i:i + 1], path_lengths=t.path_lengths[i:i + 1],
                                                      num_paths=1), tables[b]).accepted_len
                    for i in range(t.num_paths)]
        tie_broken += per_path.count(k) > 1
    assert lengths == set(range(depth + 1))
    assert tie_broken > 0  # some trees had several paths of the best length: the lowest row won


def test_greedy_accept_kernel_equals_device_accept_and_greedy_accept():
    """The CPU kernel (packed result + aux row ids) on the same crafted batch: == DeviceAccept packed, and
    the aux rows name b*N + node id (the root's row for padding slots)."""
    rng = np.random.default_rng(1)
    budget, depth = 12, 5
    trees, tables = _crafted_batch(rng, 64, budget, depth, vocab=3)
    stack = [np.stack([getattr(t, f) for t in trees]) for f in ("tokens", "paths", "path_lengths")]
    result, aux_rows = (x.asnumpy() for x in cpu_kernels.greedy_accept_op()(
        Tensor(stack[0]), Tensor(tables), Tensor(stack[1]), Tensor(stack[2]), Tensor(np.zeros(len(trees), np.int32)),
        Tensor(np.array([1, budget + 1], np.int32))))  # no caches: acceptance only
    a, emitted, node_ids = (x.asnumpy() for x in DeviceAccept(depth)(Tensor(stack[0]), Tensor(tables),
                                                                     Tensor(stack[1]), Tensor(stack[2])))
    np.testing.assert_array_equal(result, pack_result_numpy(
        [(int(a[b]), emitted[b, :a[b] + 1], node_ids[b, :a[b] + 1]) for b in range(len(trees))], depth))
    np.testing.assert_array_equal(aux_rows, (np.arange(len(trees))[:, None] * (budget + 1) + node_ids).reshape(-1))
    lengths = {unpack_result(result[b:b + 1])[0].accepted_len for b in range(len(trees))}
    assert lengths == set(range(depth + 1))
    assert all(unpack_result(result[b:b + 1])[0].accepted_len == greedy_accept(t, tables[b]).accepted_len
               for b, t in enumerate(trees))


def test_greedy_accept_kernel_commits_by_path_in_place():
    """With caches, the kernel moves slot L + n_i to L + i (i = 1..A) in every cache, in place, for every
    batch row: == ``cache.path_move_slots`` applied with NumPy; rows outside the moves keep their bytes; a
    path running past the cache is refused (nothing moved)."""
    rng = np.random.default_rng(2)
    budget, depth, batch, hkv, slots, dh = 12, 5, 16, 2, 40, 8
    trees, tables = _crafted_batch(rng, batch, budget, depth, vocab=3)
    stack = [np.stack([getattr(t, f) for t in trees]) for f in ("tokens", "paths", "path_lengths")]
    lengths = rng.integers(0, slots - budget, batch).astype(np.int32)
    caches = [rng.standard_normal((batch * hkv * slots, dh)).astype(np.float32) for _ in range(3)]
    params = [ms.Parameter(Tensor(c.copy()), name=f"c{i}") for i, c in enumerate(caches)]
    op = cpu_kernels.greedy_accept_op()
    args = [Tensor(stack[0]), Tensor(tables), Tensor(stack[1]), Tensor(stack[2])]
    result = op(*args, Tensor(lengths), Tensor(np.array([hkv, slots], np.int32)), *params)[0].asnumpy()
    moved = 0
    for b in range(batch):
        node_ids = unpack_result(result[b:b + 1])[0].node_ids
        moved += not np.array_equal(node_ids, np.arange(node_ids.size))
        src, dst = path_move_slots(int(lengths[b]), node_ids, depth + 1, slots)
        for c in caches:
            heads = c.reshape(batch, hkv, slots, dh)[b]
            heads[:, dst] = heads[:, src].copy()
    assert moved > 0
    for want, got in zip(caches, params):
        assert got.asnumpy().tobytes() == want.tobytes()
    before = [p.asnumpy().copy() for p in params]
    with pytest.raises(RuntimeError):
        op(*args, Tensor(np.full(batch, slots - 1, np.int32)), Tensor(np.array([hkv, slots], np.int32)),
           *params)[0].asnumpy()
    assert all(p.asnumpy().tobytes() == b.tobytes() for p, b in zip(params, before))


# ------------------------------------------------------------------------------ in-graph mask

class _MaskCell(nn.Cell):
    def __init__(self, window):
        super().__init__()
        self.window = window

    def construct(self, committed_len, tree_mask):
        return verify_mask(committed_len, tree_mask, self.window)


def test_verify_mask_equals_host_mask():
    """Three trees at L = 0, 7 and W - N (the branch region ends at the window) in one batch."""
    rng = np.random.default_rng(3)
    window, budget = 24, 7
    trees = [tensorize(make_tree(2, rng.integers(0, 9, m), random_parents(m, rng, 4)), L, budget, 4)
             for m, L in ((7, 0), (3, 7), (5, window - budget - 1))]
    got = _MaskCell(window)(Tensor(np.array([t.committed_len for t in trees], np.int32)),
                            Tensor(np.stack([t.tree_mask for t in trees]))).asnumpy()
    np.testing.assert_array_equal(got, np.stack([verify_attention_mask(t, window) for t in trees]))
    kernel = cpu_kernels.verify_mask_op()(Tensor(np.array([t.committed_len for t in trees], np.int32)),
                                          Tensor(np.stack([t.tree_mask for t in trees])),
                                          Tensor(np.zeros(window, np.int32))).asnumpy()
    np.testing.assert_array_equal(kernel, got)


# ------------------------------------------------------------------------------ whole step vs the host path

def _host_step(runner, t):
    """Today's path on a snapshot: verify + greedy_accept + commit_by_path; the cache is restored after.
    Returns (AcceptResult, aux rows [A+1, 3H], copied, committed cache rows [0, L + A + 1))."""
    snapshot, length = runner.snapshot(), runner.length
    out = runner.verify(t)
    acc = greedy_accept(t, out.argmax)
    copied = runner.cache.commit_by_path(acc.node_ids)
    rows = runner.cache_rows(0, runner.length)
    runner.restore(snapshot, length)
    return acc, out.aux[acc.node_ids], copied, rows


def _assert_commit_equivalent(runner, start, tokens):
    """Committed K/V of [start, start + n) == a sequential re-decode of ``tokens`` (cache restored after)."""
    committed, redone, _ = redecoded_rows(runner, start, tokens)
    assert max(rel_err(a, b) for a, b in zip(committed, redone)) < 1e-5, (start, tokens.tolist())


def _compare_step(runner, verifier, t):
    """One step both ways; asserts they agree and the commit is equivalent. Returns the DeviceStep."""
    start = runner.length
    acc, aux, copied, host_rows = _host_step(runner, t)
    step = verifier.decode(int(t.tokens[0])) if t.num_nodes == 1 else verifier.verify(t)
    assert step.accepted_len == acc.accepted_len and step.copied == copied
    assert step.tokens.tolist() == acc.tokens.tolist() and step.node_ids.tolist() == acc.node_ids.tolist()
    assert rel_err(verifier.aux_rows(step), aux) < 1e-5
    assert runner.length == start + acc.accepted_len + 1
    device_rows = runner.cache_rows(0, runner.length)
    for a, b in zip(device_rows, host_rows):
        assert a[:, :start].tobytes() == b[:, :start].tobytes()  # the committed prefix is untouched
        assert rel_err(a, b) < 1e-5
    _assert_commit_equivalent(runner, start, t.tokens[step.node_ids])
    return step


@pytest.mark.parametrize("setup", ["device", "device_kernels"])
def test_verify_step_equals_host_path_to_capacity(setup, request):
    """Oracle trees (out-of-order right children) until the cache is full: windows 32 then 64, N = 9
    steps, then decode steps (DecodeStep) near capacity; the step == the host path every time."""
    runner, verifier, compiled = request.getfixturevalue(setup)
    assert verifier.commits_in_graph == (setup == "device_kernels")
    ids = prompt(1, 9)
    base = generate(runner, ids, DecodeSettings(max_new_tokens=CAPACITY, eos_token_id=None))
    drafter = OracleDrafter(base.tokens, TINY.vocab_size, BUDGET, MAX_DEPTH, seed=3)
    root = int(runner.prefill(ids).argmax[-1])
    emitted, kinds = [root], set()
    while runner.length + 1 <= CAPACITY:
        room = runner.length + N <= CAPACITY
        tree = drafter.propose(root) if room else _empty(root)
        t = tensorize(tree, runner.length, BUDGET if room else 0, MAX_DEPTH)
        step = _compare_step(runner, verifier, t)
        kinds.add(("copy" if step.copied else "in order" if step.accepted_len else "root", room,
                   runner.attention_width(t.committed_len + t.num_nodes)))
        drafter.observe(t.tokens[step.node_ids], None, step.bonus_token)
        emitted += step.tokens.tolist()
        root = step.bonus_token
    assert emitted == base.tokens  # and the output is the teacher-only greedy output
    assert {k[0] for k in kinds if k[1]} == {"copy", "in order", "root"}
    assert {k[2] for k in kinds} == {32, 64} and (("root", False, 64) in kinds)
    assert compile_counts(verifier) == compiled


@pytest.mark.parametrize("setup", ["device", "device_kernels"])
@pytest.mark.parametrize("path, parents, prompt_len", [
    ([0, 1, 2, 3], CHAIN_STAR, 9), ([0, 2, 6], binary_parents(BUDGET), 9), ([0, 1, 2, 3], CHAIN_STAR, CAPACITY - N), ([0, 1, 3, 7], binary_parents(BUDGET), CAPACITY - N)])
def test_commit_of_the_true_continuation(setup, request, path, parents, prompt_len):
    """The teacher's own continuation placed on ``path`` (in slot order or not), also with the branch
    region ending exactly at capacity: accepted along it, committed == sequential decoding."""
    runner, verifier, _ = request.getfixturevalue(setup)
    ids = prompt(2, prompt_len)
    truth = generate(runner, ids, DecodeSettings(max_new_tokens=len(path) + 1, eos_token_id=None)).tokens
    runner.prefill(ids)
    tokens = (np.arange(BUDGET) * 5 + 1) % TINY.vocab_size
    tokens[np.array(path[1:]) - 1] = truth[1:len(path)]
    t = tensorize(make_tree(truth[0], tokens, parents), runner.length, BUDGET, MAX_DEPTH)
    step = _compare_step(runner, verifier, t)
    assert step.node_ids.tolist()[:len(path)] == path and step.copied == (path != list(range(len(path))))


def test_reference_mode_returns_argmax_and_cross_checks(device):
    runner, _, _ = device
    reference = DeviceVerifier(runner, MAX_DEPTH, reference=True)
    root = int(runner.prefill(prompt(4, 9)).argmax[-1])
    t = tensorize(make_tree(root, np.arange(BUDGET) % 7, random_parents(BUDGET, np.random.default_rng(1), 4)),
                  runner.length, BUDGET, MAX_DEPTH)
    snapshot, length = runner.snapshot(), runner.length
    host = runner.verify(t)
    runner.restore(snapshot, length)
    step = reference.verify(t)
    np.testing.assert_array_equal(step.argmax, host.argmax)
    wrong = StepResult(step.accepted_len, step.tokens + 1, step.node_ids)
    with pytest.raises(DeviceAcceptMismatch, match="greedy_accept"):
        _check_against_host(t, step.argmax, wrong)


# ------------------------------------------------------------------------------ performance-mode contract

def test_performance_outputs_have_no_vocabulary_or_node_axis(device):
    runner, verifier, _ = device
    root = int(runner.prefill(prompt(5, 9)).argmax[-1])
    t = tensorize(make_tree(root, np.arange(BUDGET), binary_parents(BUDGET)), runner.length, BUDGET, MAX_DEPTH)
    step = verifier.verify(t)
    shapes = {f.name: tuple(getattr(step, f.name).shape) for f in dataclasses.fields(step)
              if isinstance(getattr(step, f.name), (np.ndarray, Tensor))}
    assert step.argmax is None
    assert shapes["result"] == (1, result_width(MAX_DEPTH)) and shapes["accepted_aux"] == (1, MAX_DEPTH + 1, AUX)
    for name, shape in shapes.items():
        assert TINY.vocab_size not in shape and N not in shape, (name, shape)
    assert step.result.dtype == ms.int32


def test_teacher_only_decode_through_the_graph_equals_generate(device):
    """Decode steps through DecodeStep until the cache is full == generate without a drafter."""
    runner, verifier, compiled = device
    ids = prompt(6, 11)
    base = generate(runner, ids, DecodeSettings(max_new_tokens=2 * CAPACITY, eos_token_id=None))
    assert base.stop_reason == "capacity"
    tokens = [int(runner.prefill(ids).argmax[-1])]
    while runner.length + 1 <= CAPACITY:
        step = verifier.decode(tokens[-1])
        assert step.accepted_len == 0 and not step.copied
        tokens.append(step.bonus_token)
    assert tokens == base.tokens
    assert compile_counts(verifier) == compiled


def test_driver_refuses_bad_input_before_any_call(device):
    runner, verifier, compiled = device
    root = int(runner.prefill(prompt(7, 9)).argmax[-1])
    length = runner.length
    with pytest.raises(ValueError, match="committed length 3"):
        verifier.verify(tensorize(_empty(root), 3, 0, MAX_DEPTH))
    with pytest.raises(ValueError, match="paths have shape"):
        verifier.verify(tensorize(_empty(root), length, 0, MAX_DEPTH + 1))
    with pytest.raises(ValueError, match="draft tree"):
        verifier.verify(tensorize(make_tree(root, [TINY.vocab_size], [0]), length, BUDGET, MAX_DEPTH))
    runner.rewind(CAPACITY - 4)
    with pytest.raises(ValueError, match="KV cache full"):
        verifier.verify(tensorize(_empty(root), CAPACITY - 4, BUDGET, MAX_DEPTH))
    with pytest.raises(ValueError, match="commit width"):
        DeviceVerifier(runner, MAX_DEPTH + 1)
    with pytest.raises(ValueError, match="window"):
        VerifyStep(runner.model, MAX_DEPTH, CAPACITY + 1)
    with pytest.raises(ValueError, match="window"):
        DecodeStep(runner.model, MAX_DEPTH, CAPACITY + 1)
    with pytest.raises(ValueError, match="decode root"):
        verifier.decode(TINY.vocab_size)
    runner.rewind(CAPACITY)
    with pytest.raises(ValueError, match=f"KV cache full: {CAPACITY + 1} slots needed, capacity {CAPACITY}"):
        verifier.decode(root)
    assert compile_counts(verifier) == compiled


def test_decode_step_equals_verify_step_of_the_root_only_tree(device):
    """DecodeStep (two inputs) == VerifyStep of the tensorised root-only tree: packed result, aux rows and
    the K/V written at slot L, at a context in each window; reference mode checks the packing."""
    runner, verifier, _ = device
    reference = DeviceVerifier(runner, MAX_DEPTH, reference=True)
    for prompt_len in (9, 40):
        root = int(runner.prefill(prompt(9, prompt_len)).argmax[-1])
        snapshot, length = runner.snapshot(), runner.length
        want = verifier.verify(tensorize(_empty(root), length, 0, MAX_DEPTH))
        want_rows = runner.cache_rows(0, length + 1)
        runner.restore(snapshot, length)
        for v in (verifier, reference):
            got = v.decode(root)
            assert got.result.asnumpy().tolist() == want.result.asnumpy().tolist()
            assert rel_err(got.accepted_aux.asnumpy(), want.accepted_aux.asnumpy()) < 1e-6
            for a, b in zip(runner.cache_rows(0, length + 1), want_rows):
                assert rel_err(a, b) < 1e-6
            assert runner.length == length + 1
            runner.restore(snapshot, length)
        assert reference.decode(root).argmax.tolist() == [want.bonus_token]


def test_tree_inputs_from_device_tensors(device):
    """TreeInputs built over Tensors (as the draft graph hands them over) give the same step."""
    runner, verifier, _ = device
    root = int(runner.prefill(prompt(8, 9)).argmax[-1])
    t = tensorize(make_tree(root, np.arange(BUDGET) * 3, binary_parents(BUDGET)), runner.length, BUDGET, MAX_DEPTH)
    snapshot, length = runner.snapshot(), runner.length
    want = verifier.verify(t)
    runner.restore(snapshot, length)
    host_free = dataclasses.replace(TreeInputs.from_tree(t), host=None)
    got = verifier.verify(host_free)
    assert got.tokens.tolist() == want.tokens.tolist() and got.node_ids.tolist() == want.node_ids.tolist()


# ------------------------------------------------------------------------------ fused backend (emulated)

@pytest.fixture
def fused_pynative(monkeypatch):
    fake = FakeFlash()
    monkeypatch.setattr(attention.ops, "flash_attention_score", fake)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield fake
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)


def test_fused_verify_step_equals_fused_host_path(fused_pynative):
    """A 'fused' teacher (the NumPy emulation of flash_attention_score in the op's place): VerifyStep ==
    the same teacher's host path, commits equivalent; the op is handed the uint8 discard mask of the
    window. (Fused vs eager teachers: tests/test_attention_backends.py.)"""
    capacity, windows = 32, (16,)
    fused = TeacherRunner(build_teacher(capacity, "fused", seed=12)[0], 8, MAX_DEPTH + 1, windows)
    verifier = DeviceVerifier(fused, MAX_DEPTH)
    ids = prompt(9, 9)
    base = generate(fused, ids, DecodeSettings(max_new_tokens=12, eos_token_id=None))
    drafter = OracleDrafter(base.tokens, TINY.vocab_size, BUDGET, MAX_DEPTH, seed=4)
    root = int(fused.prefill(ids).argmax[-1])
    emitted = [root]
    for _ in range(2):  # window 16, then 32
        t = tensorize(drafter.propose(root), fused.length, BUDGET, MAX_DEPTH)
        fused_pynative.calls.clear()
        step = _compare_step(fused, verifier, t)
        width = fused.attention_width(t.committed_len + N)
        verify_calls = fused_pynative.calls[:2 * TINY.num_hidden_layers]  # host verify, then VerifyStep
        for call in verify_calls:
            assert call["mask_dtype"] == ms.uint8 and call["mask"].shape == (1, 1, N, width)
            np.testing.assert_array_equal(call["mask"][0, 0], ~verify_attention_mask(t, width))
        drafter.observe(t.tokens[step.node_ids], None, step.bonus_token)
        emitted += step.tokens.tolist()
        root = step.bonus_token
    assert emitted == base.tokens[:len(emitted)]
