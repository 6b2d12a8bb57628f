"""Static KV cache: verify isolation, commit by length / by path == sequential decoding, slot literals.

The second implementation is sequential one-token decoding of the committed tokens through the same
Cell (and, for the whole multi-step prefix, a fresh prefill of prompt + every committed token).
"""
import numpy as np
import pytest

from mindspore import Tensor

from helpers_models import (TINY, binary_parents, build_teacher, make_runner, make_tree, prompt,
                            random_parents, rel_err, root_path, star_parents)

from eagle_ms.cache import BranchCache, path_move_slots
from eagle_ms.models.kv_cache import KVCache, flat_rows, window_rows
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.host_step import CommitMismatch
from eagle_ms.oracle_drafter import OracleDrafter
from eagle_ms.teacher import TeacherRunner
from eagle_ms.tree import tensorize

BUDGET = 16
MAX_DEPTH = 10
CAPACITY = 64
TOL = 1e-5


@pytest.fixture(scope="module")
def teacher():
    model, state = build_teacher(CAPACITY, seed=21)
    return model, make_runner(model, prefill_chunk=8, max_depth=MAX_DEPTH)


def _max_diff(rows_a, rows_b):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(rows_a, rows_b))


def _verify_tree(runner, tokens, parents, prompt_ids):
    out = runner.prefill(prompt_ids)
    t = tensorize(make_tree(int(out.argmax[-1]), tokens, parents), runner.length, BUDGET, MAX_DEPTH)
    return t


# ------------------------------------------------------------------------------ slot arithmetic literals

def test_path_move_slots_worked_example():
    src, dst = path_move_slots(10, np.array([0, 2, 5]), 4)
    assert src.tolist() == [10, 12, 15, 13] and dst.tolist() == [10, 11, 12, 13]
    assert src.dtype == np.int32 and dst.dtype == np.int32


def test_path_move_slots_full_width_and_root_only():
    src, dst = path_move_slots(3, np.array([0, 1, 4, 6]), 4)
    assert src.tolist() == [3, 4, 7, 9] and dst.tolist() == [3, 4, 5, 6]
    src, dst = path_move_slots(0, np.array([0]), 3)
    assert src.tolist() == [0, 1, 2] and dst.tolist() == [0, 1, 2]


def test_path_move_slots_near_capacity_stays_in_range():
    """L + width > capacity: padding entries wrap to distinct in-range identity copies."""
    src, dst = path_move_slots(10, np.array([0, 2, 3]), 6, capacity=14)
    assert src.tolist() == [10, 12, 13, 13, 0, 1] and dst.tolist() == [10, 11, 12, 13, 0, 1]
    for l, ids, width, cap in [(59, [0, 2, 4], 11, 64), (0, [0, 5], 8, 8), (30, [0, 1, 3], 32, 34)]:
        src, dst = path_move_slots(l, np.array(ids), width, capacity=cap)
        assert src.min() >= 0 and src.max() < cap and dst.min() >= 0 and dst.max() < cap
        assert len(set(dst.tolist())) == width  # no duplicate destinations
        assert dst[:len(ids)].tolist() == list(range(l, l + len(ids)))
        assert src[:len(ids)].tolist() == [l + i for i in ids]
        assert (src[len(ids):] == dst[len(ids):]).all()


@pytest.mark.parametrize("ids, width, cap", [([1, 2], 4, None), ([0, 2, 2], 4, None), ([0, 3, 1], 4, None),
                                             ([0, 1, 2, 3, 4], 4, None), ([], 4, None), ([0, 5], 4, 14),
                                             ([0, 1], 20, 14)])
def test_path_move_slots_rejects_bad_paths(ids, width, cap):
    with pytest.raises(ValueError):
        path_move_slots(10, np.array(ids, dtype=np.int64), width, capacity=cap)


def test_flat_rows_worked_example():
    """B=1, Hkv=2, S=8, slots [5, 6] -> rows [5, 13, 6, 14] (order (b, n, h)); B=2 adds Hkv*S per sequence."""
    rows = flat_rows(Tensor(np.array([[5, 6]], np.int32)), 2, 8).asnumpy()
    assert rows.tolist() == [5, 13, 6, 14]
    rows = flat_rows(Tensor(np.array([[1], [2]], np.int32)), 2, 8).asnumpy()
    assert rows.tolist() == [1, 9, 18, 26]


def test_window_rows_worked_example():
    """B=1, Hkv=2, S=8, width 3 -> [0, 1, 2, 8, 9, 10]; B=2 repeats the pattern per sequence."""
    assert window_rows(1, 2, 8, 3).asnumpy().tolist() == [0, 1, 2, 8, 9, 10]
    assert window_rows(2, 1, 4, 2).asnumpy().tolist() == [0, 1, 4, 5]


@pytest.mark.parametrize("width", [3, 8])
def test_update_writes_then_returns_the_window(width):
    """KVCache.update == NumPy: scatter k/v [B, N, Hkv, D] at flat_rows, then slots [0, width) as [B, Hkv, W, D]."""
    batch, hkv, cap, d = 2, 2, 8, 4
    rng = np.random.default_rng(5)
    cache = KVCache(batch, hkv, cap, d)
    old_k, old_v = rng.standard_normal((2, batch * hkv * cap, d)).astype(np.float32)
    cache.k_cache.set_data(Tensor(old_k))
    cache.v_cache.set_data(Tensor(old_v))
    slots = np.array([[1, 2], [6, 7]], np.int32)
    k, v = rng.standard_normal((2, batch, 2, hkv, d)).astype(np.float32)             # [B, N, Hkv, D]
    k_win, v_win = cache.update(Tensor(k), Tensor(v), flat_rows(Tensor(slots), hkv, cap), width)
    for new, old, got in ((k, old_k, k_win), (v, old_v, v_win)):
        want = old.reshape(batch, hkv, cap, d).copy()
        for b in range(batch):
            want[b][:, slots[b]] = new[b].swapaxes(0, 1)
        np.testing.assert_array_equal(got.asnumpy(), want[:, :, :width])
        np.testing.assert_array_equal(cache.k_cache.asnumpy() if new is k else cache.v_cache.asnumpy(),
                                      want.reshape(-1, d))


def test_branch_cache_bookkeeping_without_device():
    cache = BranchCache(capacity=10, mover=None, width=4)
    assert cache.branch_slots(3).tolist() == [0, 1, 2]
    cache.commit_by_length(2)
    assert cache.length == 3
    assert cache.commit_by_path(np.array([0, 1])) is False and cache.length == 5 and cache.copies == 0
    with pytest.raises(RuntimeError):
        cache.commit_by_path(np.array([0, 2]))
    with pytest.raises(ValueError, match="capacity"):
        cache.branch_slots(6)
    cache.reset()
    assert cache.length == 0 and cache.copies == 0


# ------------------------------------------------------------------------------ isolation

@pytest.mark.parametrize("parents", [star_parents(16), binary_parents(12), random_parents(16, np.random.default_rng(4), 8)])
def test_verify_never_touches_committed_region(teacher, parents):
    model, runner = teacher
    prompt_ids = prompt(1, 13)
    t = _verify_tree(runner, np.arange(len(parents)) % TINY.vocab_size, parents, prompt_ids)
    length = runner.length
    before = runner.snapshot()
    runner.verify(t)
    after = runner.snapshot()
    n = BUDGET + 1
    for a, b in zip(before, after):
        a = a.reshape(TINY.num_key_value_heads, CAPACITY, -1)
        b = b.reshape(TINY.num_key_value_heads, CAPACITY, -1)
        assert a[:, :length].tobytes() == b[:, :length].tobytes()  # committed prefix: bit-identical
        assert a[:, length + n:].tobytes() == b[:, length + n:].tobytes()  # beyond the branch region too
        assert not np.array_equal(a[:, length:length + n], b[:, length:length + n])  # branch was written
    assert runner.length == length


def test_stale_branch_region_does_not_leak(teacher):
    """Verify tree A, then tree B: B's outputs equal B verified on a pristine post-prefill cache."""
    model, runner = teacher
    prompt_ids = prompt(2, 10)
    t_a = _verify_tree(runner, np.arange(16) + 3, random_parents(16, np.random.default_rng(0), 5), prompt_ids)
    pristine, length = runner.snapshot(), runner.length
    t_b = tensorize(make_tree(int(t_a.tokens[0]), np.arange(9) * 5 % TINY.vocab_size, binary_parents(9)),
                    length, BUDGET, MAX_DEPTH)
    runner.verify(t_a)
    after_a = runner.verify(t_b)
    runner.restore(pristine, length)
    fresh = runner.verify(t_b)
    np.testing.assert_array_equal(after_a.logits[:10], fresh.logits[:10])


# ------------------------------------------------------------------------------ commit equivalence

def _commit_and_compare(runner, t, path, expect_copy):
    """Verify t, commit `path`, compare slots [0, L+len) with a sequential decode of the path tokens;
    then one more decode step must give the same logits on both caches."""
    length = runner.length
    pristine = runner.snapshot()
    runner.verify(t)
    copies = runner.cache.copies
    copied = runner.cache.commit_by_path(np.array(path))
    assert copied is expect_copy
    assert runner.cache.copies == copies + int(expect_copy)
    assert runner.length == length + len(path)
    committed = runner.cache_rows(0, runner.length)
    nxt = runner.decode_chain(np.array([7]))

    runner.restore(pristine, length)
    runner.decode_chain(t.tokens[path])
    sequential = runner.cache_rows(0, runner.length)
    nxt_seq = runner.decode_chain(np.array([7]))
    for a, b in zip(committed, sequential):  # prefix [0, L): bit-identical
        assert a[:, :length].tobytes() == b[:, :length].tobytes()
    assert _max_diff(committed, sequential) < TOL, f"commit of {path} differs from sequential decode"
    assert rel_err(nxt.logits, nxt_seq.logits) < 1e-4


@pytest.mark.parametrize("path, parents", [
    ([0, 2, 6], binary_parents(10)),        # 0 -> 2 -> 6: out of order, device copy
    ([0, 3], star_parents(16)),             # a later sibling
    ([0, 16], star_parents(16)),            # the last node of the budget
    ([0, 1, 4, 9], binary_parents(10)),     # partial order: starts in order then jumps
])
def test_commit_by_path_out_of_order_equals_sequential(teacher, path, parents):
    model, runner = teacher
    t = _verify_tree(runner, (np.arange(len(parents)) * 7 + 1) % TINY.vocab_size, parents, prompt(3, 11))
    assert root_path(parents, path[-1]) == path
    _commit_and_compare(runner, t, path, expect_copy=True)


@pytest.mark.parametrize("path, parents", [([0, 1, 2, 3], list(range(10))), ([0], binary_parents(10)),
                                           ([0, 1], binary_parents(10))])
def test_commit_by_length_equals_sequential(teacher, path, parents):
    model, runner = teacher
    t = _verify_tree(runner, (np.arange(len(parents)) * 3 + 2) % TINY.vocab_size, parents, prompt(4, 9))
    _commit_and_compare(runner, t, path, expect_copy=False)


def test_many_commits_equal_one_sequential_decode(teacher):
    """Five verify+commit steps on random trees and random out-of-order root paths; the whole
    cache prefix then equals a fresh prefill + sequential decode of every committed token."""
    model, runner = teacher
    rng = np.random.default_rng(5)
    prompt_ids = prompt(5, 6)
    out = runner.prefill(prompt_ids)
    root = int(out.argmax[-1])
    committed_tokens = []
    for _ in range(5):
        parents = random_parents(16, rng, 6)
        t = tensorize(make_tree(root, rng.integers(0, TINY.vocab_size, 16), parents),
                      runner.length, BUDGET, MAX_DEPTH)
        runner.verify(t)
        scattered = [k for k in range(17) if root_path(parents, k) != list(range(len(root_path(parents, k))))]
        path = root_path(parents, int(rng.choice(scattered)))
        assert runner.cache.commit_by_path(np.array(path)) is True
        committed_tokens.extend(t.tokens[path].tolist())
        root = int(rng.integers(0, TINY.vocab_size))
    assert runner.cache.copies == 5
    final = runner.cache_rows(0, runner.length)
    length = runner.length
    runner.prefill(np.concatenate([prompt_ids, committed_tokens]))
    assert runner.length == length
    assert _max_diff(final, runner.cache_rows(0, length)) < TOL


def test_commit_near_capacity_with_wide_mover(teacher):
    """L + commit width > capacity (width = max_depth + 1 = 21 > N): the out-of-order commit must stay in
    range and still equal sequential decoding (regression: the mover used to index past the cache)."""
    model, _ = teacher
    runner = TeacherRunner(model, prefill_chunk=8, commit_width=21)
    t = _verify_tree(runner, (np.arange(16) * 5 + 4) % TINY.vocab_size, star_parents(16), prompt(6, 47))
    assert runner.length + 21 > CAPACITY and runner.length + BUDGET + 1 <= CAPACITY
    _commit_and_compare(runner, t, [0, 16], expect_copy=True)


# ------------------------------------------------------------------------------ reference-mode check

def test_reference_mode_detects_a_broken_commit(teacher, monkeypatch):
    """With the device copy skipped, reference_checks raises CommitMismatch; without checks it doesn't."""
    model, runner = teacher
    prompt_ids = prompt(9, 8)
    base = generate(runner, prompt_ids, DecodeSettings(max_new_tokens=20))

    def commit_without_copy(self, node_ids):
        node_ids = np.asarray(node_ids)
        self.length += node_ids.size
        return not np.array_equal(node_ids, np.arange(node_ids.size))

    monkeypatch.setattr(BranchCache, "commit_by_path", commit_without_copy)
    settings = DecodeSettings(budget=BUDGET, max_depth=MAX_DEPTH, max_new_tokens=20, reference_checks=True)
    with pytest.raises(CommitMismatch, match="commit equivalence failed"):
        generate(runner, prompt_ids, settings, OracleDrafter(base.tokens, TINY.vocab_size, BUDGET, 4,
                                                             error_rate=0.2, branching=3, seed=0))
