"""The sampling rule (eagle_ms/sampling.py) against second implementations, and the in-graph Sampler
(eagle_ms/models/sampler.py) against the host reference.

- the hash: a pure-Python-int implementation of lowbias32 / the Weyl words written here; u exact;
- processing: a float64 NumPy reference of the kept set written from the rule's definition (top-k: fewer
  than k tokens strictly above; top-p: mass strictly above < p), on crafted logits with ties at both
  boundaries and on random quantised logits (many ties);
- Gumbel-max over positions: the empirical distribution of many positions matches the processed
  softmax (chi-square); greedy is argmax with the first index on ties;
- sample-and-match over crafted trees, and drawing only reachable nodes changes nothing;
- the graph Sampler: hash words bit for bit, kept sets and tokens equal on crafted and random logits;
- invalid values are one clear error naming the key (config and CLI).
"""
import numpy as np
import pytest
from scipy import stats

import mindspore as ms
from mindspore import Tensor, nn

from eagle_ms import sampling
from eagle_ms.config import SamplingParams, config_from_dict
from eagle_ms.models.sampler import Sampler, noise_words as graph_words
from eagle_ms.tree import DraftTree, tensorize
from eagle_ms.verify import greedy_accept, sample_accept, tree_samples

M32 = 0xFFFFFFFF


def py_mix(x: int) -> int:
    """lowbias32 with Python ints (the second implementation of the hash)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def py_word(seed: int, p: int, v: int) -> int:
    key = py_mix(py_mix(seed) ^ p)
    return py_mix((key + v * 0x9E3779B9) & M32)


# ------------------------------------------------------------------------------ the hash

def test_hash_words_equal_a_python_int_implementation():
    rng = np.random.default_rng(0)
    cases = [(0, 0), (1, 0), (M32, 2 ** 31 - 1), (12345, 77)] + [
        (int(rng.integers(0, 2 ** 32)), int(rng.integers(0, 2 ** 31))) for _ in range(20)]
    vocab = 300
    for seed, p in cases:
        words = sampling.noise_words(seed, np.array([p]), vocab)[0]
        assert words.dtype == np.uint32
        assert [int(w) for w in words] == [py_word(seed, p, v) for v in range(vocab)], (seed, p)
    assert int(sampling.mix32(1)) == py_mix(1) == 0x688990C0


def test_uniforms_are_exact_and_strictly_inside_the_unit_interval():
    words = np.array([0, 1, 511, 512, 2 ** 31, M32], dtype=np.uint32)
    u = sampling.uniforms(words)
    assert u.dtype == np.float32
    expected = [((int(w) >> 9) + 0.5) / 2 ** 23 for w in words]  # float64, exact
    assert u.astype(np.float64).tolist() == expected
    assert 0 < u.min() and u.max() < 1 and u[0] == u[2] and u[3] > u[2]


# ------------------------------------------------------------------------------ processing

def ref_kept(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """float64 kept set from the definition: top-k keeps v iff fewer than k tokens have z > z_v; top-p
    (on the top-k kept, renormalised) keeps v iff the mass of tokens strictly more probable is < p."""
    z = np.asarray(z, np.float64)
    keep = np.ones(z.shape, bool)
    for r in range(z.shape[0]):
        if 0 < top_k < z.shape[1]:
            keep[r] = np.array([(z[r] > zv).sum() < top_k for zv in z[r]])
        if top_p < 1:
            q = np.where(keep[r], np.exp(z[r] - z[r].max()), 0.0)
            q /= q.sum()
            keep[r] &= np.array([q[q > qv].sum() < top_p for qv in q])
    return keep


CRAFTED = [
    # (logits row, top_k, top_p, kept indices)
    ([1, 3, 3, 2], 2, 1.0, [1, 2]),                  # k = 2, no tie at the boundary
    ([1, 3, 2, 2, 0], 2, 1.0, [1, 2, 3]),            # a tie at the k-th value: both kept
    ([5, 5, 5, 5], 1, 1.0, [0, 1, 2, 3]),            # all tied: all kept
    ([0, 0, 0, 1], 0, 0.5, [0, 1, 2, 3]),            # top-p boundary inside a tie: the whole tie kept
    ([2, 0, 0, -9], 0, 0.8, [0, 1, 2]),              # mass above each of the tied pair is ~0.79 < 0.8
    ([2, 0, 0, -9], 0, 0.78, [0]),                   # ... and > 0.78: both dropped together
    ([4, 1, 1, 1, 0], 3, 0.99, [0, 1, 2, 3]),        # top-k first (4 kept by the tie), then top-p
    ([3, 0, -1, -2], 0, 1.0, [0, 1, 2, 3]),          # off
    ([3, 0, -1, -2], 0, 0.01, [0]),                  # the most likely token is always kept
]


@pytest.mark.parametrize("row, top_k, top_p, kept", CRAFTED)
def test_kept_set_on_crafted_logits(row, top_k, top_p, kept):
    z = np.array([row], np.float32)
    got = sampling.kept_mask(z, top_k, top_p)
    assert np.flatnonzero(got[0]).tolist() == kept
    assert np.array_equal(got, ref_kept(z, top_k, top_p))


def _near_a_top_p_boundary(z: np.ndarray, top_k: int, top_p: float) -> bool:
    """True if some token's 'mass strictly above' is within 1e-5 of top_p (float32 may decide either way)."""
    z = np.asarray(z, np.float64)
    keep = ref_kept(z[None], top_k, 1.0)[0]
    q = np.where(keep, np.exp(z - z.max()), 0.0)
    q /= q.sum()
    return any(abs(q[q > qv].sum() - top_p) < 1e-5 for qv in q)


def test_kept_set_on_random_quantised_logits():
    rng = np.random.default_rng(1)
    checked = 0
    for trial in range(300):
        v = int(rng.integers(2, 40))
        z = (np.round(rng.standard_normal(v) * 4) / 4).astype(np.float32)  # steps of 0.25: many ties
        top_k = int(rng.choice([0, 1, 3, 10, 50]))
        top_p = float(rng.choice([1.0, 0.9, 0.63, 0.3]))
        if top_p < 1 and _near_a_top_p_boundary(z, top_k, top_p):
            continue
        assert np.array_equal(sampling.kept_mask(z[None], top_k, top_p), ref_kept(z[None], top_k, top_p)), \
            (z.tolist(), top_k, top_p)
        checked += 1
    assert checked > 250


def test_greedy_is_argmax_first_index_on_ties():
    logits = np.array([[1, 3, 3, 0], [0, 0, 0, 0]], np.float32)
    assert sampling.sample_rows(logits, [5, 9], SamplingParams()).tolist() == [1, 0]


@pytest.mark.parametrize("params", [SamplingParams(1.0, 0, 1.0, 4), SamplingParams(0.5, 0, 1.0, 5),
                                    SamplingParams(1.5, 4, 1.0, 6), SamplingParams(1.0, 0, 0.8, 7)])
def test_draws_over_positions_follow_the_processed_distribution(params):
    """One logits row drawn at 40 000 positions: a chi-square test against softmax(z) on the kept set
    (p-value > 1e-3); logits scaled by 1.25 (a wrong temperature) fail the same test."""
    z_row = np.array([2.0, 1.5, 1.0, 0.2, 0.0, -0.5, -1.0, -3.0], np.float32)
    n = 40_000
    logits = np.repeat(z_row[None], n, axis=0)
    positions = np.arange(n) * 7 + 3

    def p_value(tokens):
        z = z_row.astype(np.float64) / params.temperature
        keep = ref_kept(z[None], params.top_k, params.top_p)[0]
        q = np.where(keep, np.exp(z - z.max()), 0.0)
        q /= q.sum()
        counts = np.bincount(tokens, minlength=z.size)
        assert counts[~keep].sum() == 0
        return stats.chisquare(counts[keep], q[keep] * n).pvalue

    assert p_value(sampling.sample_rows(logits, positions, params)) > 1e-3
    wrong = sampling.sample_rows(logits * np.float32(1.25), positions, params)  # a temperature off by 1.25x
    assert p_value(wrong) < 1e-3


def test_the_token_depends_only_on_seed_position_and_logits():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 50)).astype(np.float32)
    params = SamplingParams(1.0, 0, 1.0, 9)
    together = sampling.sample_rows(logits, [10, 11, 12, 10, 13, 14], params)
    alone = [int(sampling.sample_rows(logits[i:i + 1], [p], params)[0]) for i, p in enumerate([10, 11, 12, 10, 13, 14])]
    assert together.tolist() == alone
    shifted = sampling.sample_rows(np.repeat(logits[:1], 200, 0), np.arange(200), params)
    assert len(set(shifted.tolist())) > 10  # other positions, other draws
    other_seed = sampling.sample_rows(np.repeat(logits[:1], 200, 0), np.arange(200), SamplingParams(1.0, 0, 1.0, 10))
    assert (other_seed != shifted).mean() > 0.5


def test_stream_seeds_are_distinct_words():
    seeds = {sampling.stream_seed(3, salt) for salt in range(1000)}
    assert len(seeds) == 1000 and all(0 <= s < 2 ** 32 for s in seeds)
    assert sampling.stream_seed(3, 5) == py_mix(py_mix(3) ^ py_mix(5))


# ------------------------------------------------------------------------------ sample-and-match

def _tree(root, tokens, parents, committed_len=10):
    tree = DraftTree(root, np.array(tokens, np.int64), np.array(parents, np.int64), np.zeros(len(tokens)))
    depth = [0]
    for p in parents:
        depth.append(depth[p] + 1)
    return tensorize(tree, committed_len, len(tokens) + 2, max(depth))


def test_sample_accept_walks_like_greedy_on_the_samples():
    t = _tree(5, [7, 8, 9], [0, 0, 1])  # paths [0, 2] and [0, 1, 3]
    r = sample_accept(t, np.array([7, 9, 5, 4, 0, 0]))
    assert r.node_ids.tolist() == [0, 1, 3] and r.tokens.tolist() == [7, 9, 4] and r.accepted_len == 2
    r = sample_accept(t, np.array([8, -1, 6, -1, -1, -1]))
    assert r.node_ids.tolist() == [0, 2] and r.tokens.tolist() == [8, 6]
    with pytest.raises(ValueError, match="target_sample must be an integer array"):
        sample_accept(t, np.zeros(6))


def test_drawing_only_reachable_nodes_gives_the_same_acceptance():
    """tree_samples draws the root and matched nodes only; sample_accept on it == on every node drawn at
    position_ids + 1 (random trees with repeated sibling tokens, small vocabulary so matches happen)."""
    rng = np.random.default_rng(3)
    vocab = 6
    for trial in range(200):
        m = int(rng.integers(1, 12))
        parents = [int(rng.integers(0, k)) for k in range(1, m + 1)]
        t = _tree(int(rng.integers(0, vocab)), rng.integers(0, vocab, m).tolist(), parents, int(rng.integers(0, 50)))
        logits = rng.standard_normal((t.num_nodes, vocab)).astype(np.float32) * 0.5
        params = SamplingParams(1.0, int(rng.choice([0, 3])), float(rng.choice([1.0, 0.8])), trial)
        full = sampling.sample_rows(logits, t.position_ids + 1, params)
        lazy = tree_samples(t, logits, params)
        a, b = sample_accept(t, full), sample_accept(t, lazy)
        assert a.node_ids.tolist() == b.node_ids.tolist() and a.tokens.tolist() == b.tokens.tolist()
        assert np.array_equal(lazy[lazy >= 0], full[lazy >= 0]) and lazy[0] == full[0]
    greedy = greedy_accept(t, logits.argmax(-1))
    assert sample_accept(t, tree_samples(t, logits, SamplingParams())).tokens.tolist() == greedy.tokens.tolist()


# ------------------------------------------------------------------------------ the graph Sampler

class _Parts(nn.Cell):
    """The Sampler's hash words and kept set, as graph outputs (for the bitwise comparisons)."""

    def __init__(self, sampler):
        super().__init__()
        self.sampler = sampler

    def construct(self, logits, positions):
        z = logits / self.sampler.temperature
        return graph_words(self.sampler.seed, positions, self.sampler.steps), self.sampler.kept(z)


GRAPH_PARAMS = [SamplingParams(0.0), SamplingParams(1.0, 0, 1.0, 7), SamplingParams(0.7, 20, 0.9, 2 ** 32 - 1),
                SamplingParams(1.3, 0, 0.8, 0), SamplingParams(1.0, 3, 1.0, 123)]


@pytest.mark.parametrize("params", GRAPH_PARAMS)
def test_graph_sampler_equals_the_host_reference(params):
    rng = np.random.default_rng(4)
    b, n, v = 1, 24, 300
    crafted = np.full((4, v), -4.0, np.float32)
    crafted[0, :3] = [2, 2, 1]        # argmax tie (greedy: first) and a top-k tie
    crafted[1, :4] = [0, 0, 0, 1]     # a top-p tie at the boundary
    crafted[2, :5] = [3, 1, 1, 1, 0]
    crafted[3, :] = 0.0               # all tied
    random = (rng.standard_normal((n - 4, v)) * 3).astype(np.float32)
    logits = np.concatenate([crafted, random])[None]                  # [1, N, V]
    positions = rng.integers(0, 2 ** 31 - 1, (b, n)).astype(np.int32)
    positions[0, :3] = [0, 1, 1]
    sampler = Sampler(params, v)
    tokens = sampler(Tensor(logits), Tensor(positions)).asnumpy()
    assert tokens.dtype == np.int32 and tokens.shape == (b, n)
    assert tokens[0].tolist() == sampling.sample_rows(logits[0], positions[0], params).tolist()
    if not params.greedy:
        words, kept = _Parts(sampler)(Tensor(logits), Tensor(positions))
        assert np.array_equal(words.asnumpy().view(np.uint32), sampling.noise_words(params.seed, positions, v))
        z = logits[0] / np.float32(params.temperature)
        assert np.array_equal(kept.asnumpy()[0], sampling.kept_mask(z, params.top_k, params.top_p))


def test_graph_sampler_compiles_once_for_new_values():
    params = SamplingParams(1.0, 5, 0.9, 1)
    sampler = Sampler(params, 64)
    rng = np.random.default_rng(5)
    for _ in range(3):
        logits = rng.standard_normal((1, 8, 64)).astype(np.float32)
        positions = rng.integers(0, 1000, (1, 8)).astype(np.int32)
        got = sampler(Tensor(logits), Tensor(positions)).asnumpy()[0]
        assert got.tolist() == sampling.sample_rows(logits[0], positions[0], params).tolist()
    if ms.get_context("mode") == ms.GRAPH_MODE:
        assert len(sampler.compile_cache) == 1


# ------------------------------------------------------------------------------ invalid values

BASE = {"model": {"model_config": {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
                                   "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}}}


@pytest.mark.parametrize("key, value", [
    ("temperature", -0.5), ("temperature", float("inf")), ("temperature", float("nan")), ("temperature", 1e-9),
    ("temperature", True), ("temperature", "hot"), ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.1),
    ("top_p", None), ("top_k", -1), ("top_k", 2.5), ("seed", -1), ("seed", 2 ** 32), ("seed", "x"),
])
def test_invalid_sampling_values_name_the_key(key, value):
    with pytest.raises(ValueError, match=rf"config key 'generation\.{key}' = "):
        config_from_dict({**BASE, "generation": {key: value}})


def test_valid_sampling_values_and_the_cli_error(capsys):
    cfg = config_from_dict({**BASE, "generation": {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "seed": 3}})
    assert cfg.generation.sampling == SamplingParams(0.7, 20, 0.9, 3)
    assert config_from_dict(BASE).generation.sampling.greedy
    from eagle_ms.cli import main

    assert main(["generate", "--config", "configs/tiny.yaml", "--prompt-ids", "5,6", "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert "config key 'generation.temperature' = -1.0: must be 0 (greedy)" in err and "Traceback" not in err
