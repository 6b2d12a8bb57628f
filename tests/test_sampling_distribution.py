"""Tree-level joint distribution of sampled output, with power.

A tiny random Pangu teacher (vocabulary 16) decodes the first 3 tokens after a fixed prompt in N_RUNS
runs with seeds 0..N_RUNS-1.

- Speculative: every run goes through the real loop (``eagle_ms.generate.generate``: the real tree
  tensors, sample-and-match acceptance and position-keyed sampler) with an EAGLE-style drafter
  (deterministic top-k children of a draft distribution close to, but not, the teacher's). Only the
  teacher forward is replaced: ``NumpyTeacher`` answers prefill/verify with the float64 NumPy forward of
  the same model (tests/numpy_reference.py) over each node's context (committed prefix + its root path),
  cast to float32 as the compiled teacher returns it, memoised per context.
- Teacher-only: the runs are decoded side by side (``batched_teacher_only``: position by position, the
  real sampler with one seed per row), which is 100x faster than N_RUNS loop calls; it is checked equal,
  seed by seed, to the real teacher-only loop on the first N_LOOP seeds.

The exact joint distribution of (x1, x2, x3) is enumerated in float64 from the same logits:
P = q(x1 | prompt) q(x2 | prompt, x1) q(x3 | prompt, x1, x2), q = softmax(l / T) renormalised on the
kept set (top-k, then top-p, from their definitions: tests/test_sampling.py ``ref_kept``).

The test: Pearson chi-square over the 16**3 cells, cells with expected count < 5 pooled into one, df =
cells - 1; a run passes when the p-value > 1e-3 (a correct sampler fails one such check in 1 000; the
seeds are fixed, so the outcome is deterministic). Wrong variants must fail the same test (p < 1e-3)
with the same N_RUNS: temperature applied twice, and noise keyed without the position (each token's
conditional is right for the first token, the joint is not).
"""
import numpy as np
import pytest
from scipy import stats

from eagle_ms.config import ModelConfig, SamplingParams
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.sampling import sample_rows
from eagle_ms.teacher import TeacherOutput
from eagle_ms.tree import DraftTree
from eagle_ms.weights import random_teacher_state
from numpy_reference import reference_forward
from test_sampling import ref_kept

VOCAB = 16
CFG = ModelConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                  num_attention_heads=2, num_key_value_heads=1, eos_token_id=VOCAB - 1)
PROMPT = np.array([3, 7, 1, 12], np.int32)
N_RUNS = 20_000
N_LOOP = 1_000  # seeds on which the batched teacher-only decode is checked against the real loop
TOKENS = 3
P_MIN = 1e-3
# T 0.8, top-k 6, top-p 0.9: every stage of the processing is active at every context (checked below)
PARAMS = dict(temperature=0.8, top_k=6, top_p=0.9)


class NumpyTeacher:
    """The runner interface ``generate`` uses (prefill, verify, length, capacity, attention_width,
    cache.commit_by_path), answered by the float64 reference forward of each node's context.

    ``scale`` != 1 is a deliberately wrong teacher: logits * scale (1 / T = temperature applied twice).
    """

    capacity = 64

    def __init__(self, state, scale: float = 1.0):
        self.state, self.scale = state, scale
        self.memo: dict[tuple, np.ndarray] = {}
        self.verified_memo: dict[tuple, TeacherOutput] = {}
        self.committed: list[int] = []
        self.cache = self  # commit_by_path lives here
        self._verified = None

    def logits(self, context) -> np.ndarray:
        """float32 logits [V] of the token after ``context`` (memoised)."""
        key = tuple(int(t) for t in context)
        if key not in self.memo:
            full = reference_forward(CFG, self.state, np.array(key)).logits[-1]
            self.memo[key] = (full * self.scale).astype(np.float32)
        return self.memo[key]

    @property
    def length(self) -> int:
        return len(self.committed)

    def attention_width(self, end: int) -> int:
        return self.capacity

    def prefill(self, prompt_ids) -> TeacherOutput:
        self.committed = [int(t) for t in prompt_ids]
        logits = np.stack([self.logits(self.committed[:i + 1]) for i in range(len(self.committed))])
        return TeacherOutput(logits, np.zeros((logits.shape[0], 1)), logits.argmax(-1))

    def verify(self, tensors, allowed=None) -> TeacherOutput:
        """Row k: the logits after committed + the tokens of node k's root path (root first)."""
        self._verified = tensors
        key = (tuple(self.committed), tensors.tokens.tobytes(), tensors.parent.tobytes(), tensors.valid.tobytes())
        if key not in self.verified_memo:
            rows = []
            for k in range(tensors.num_nodes):
                path = [0] + [int(a) for a in tensors.ancestors[::-1, k] if a != 0] if tensors.valid[k] else [0]
                rows.append(self.logits(self.committed + [int(tensors.tokens[n]) for n in path]))
            logits = np.stack(rows)
            self.verified_memo[key] = TeacherOutput(logits, np.zeros((logits.shape[0], 1)), logits.argmax(-1))
        return self.verified_memo[key]

    def commit_by_path(self, node_ids) -> bool:
        self.committed += [int(t) for t in self._verified.tokens[np.asarray(node_ids)]]
        return False  # no copy


class TopKDrafter:
    """EAGLE-style tree: a node's children are the top ``widths[d]`` tokens of the draft distribution at
    its context (teacher logits * 0.6 + a fixed per-context perturbation), to depth len(widths)."""

    def __init__(self, teacher: NumpyTeacher, widths=(3, 2), memo=None):
        self.teacher, self.widths = teacher, widths
        self.context: list[int] = []
        self.memo = {} if memo is None else memo  # context -> ranked draft tokens (shared across runs)

    def _ranked(self, context) -> list[int]:
        key = tuple(context)
        if key not in self.memo:
            noise = np.random.default_rng(list(key)).standard_normal(VOCAB)
            self.memo[key] = np.argsort(-(self.teacher.logits(context) * 0.6 + noise), kind="stable").tolist()
        return self.memo[key]

    def begin(self, prompt_ids, prompt_aux, root):
        self.context = [int(t) for t in prompt_ids]

    def propose(self, root) -> DraftTree:
        tokens, parents, frontier = [], [], [(0, self.context + [int(root)])]
        for width in self.widths:
            nxt = []
            for node, ctx in frontier:
                for tok in self._ranked(ctx)[:width]:
                    tokens.append(tok)
                    parents.append(node)
                    nxt.append((len(tokens), ctx + [tok]))
            frontier = nxt
        return DraftTree(root, np.array(tokens), np.array(parents), np.zeros(len(tokens)))

    def observe(self, committed, aux, next_root):
        self.context += [int(t) for t in committed]


def first_tokens(teacher: NumpyTeacher, speculative: bool, n_runs: int = N_RUNS) -> tuple[np.ndarray, list]:
    """([n_runs, 3] first emitted tokens of runs with seeds 0..n_runs-1, accepted lengths of all steps)."""
    out = np.zeros((n_runs, TOKENS), np.int64)
    accepted, draft_memo = [], {}
    for seed in range(n_runs):
        settings = DecodeSettings(budget=9, max_depth=2, max_new_tokens=TOKENS,
                                  sampling=SamplingParams(seed=seed, **PARAMS))
        drafter = TopKDrafter(teacher, memo=draft_memo) if speculative else None
        result = generate(teacher, PROMPT, settings, drafter)
        out[seed] = result.tokens
        accepted += result.accepted_lengths
    return out, accepted


def processed(logits: np.ndarray) -> np.ndarray:
    """float64 q [V]: softmax(l / T) on the kept set (the definition), from float32 logits."""
    z = logits.astype(np.float64) / PARAMS["temperature"]
    keep = ref_kept(z[None], PARAMS["top_k"], PARAMS["top_p"])[0]
    q = np.where(keep, np.exp(z - z.max()), 0.0)
    return q / q.sum()


def exact_joint(teacher: NumpyTeacher) -> np.ndarray:
    """[V, V, V] float64: P(x1, x2, x3) by enumeration over the teacher's contexts."""
    prompt = [int(t) for t in PROMPT]
    joint = np.zeros((VOCAB,) * 3)
    q1 = processed(teacher.logits(prompt))
    for a in np.flatnonzero(q1):
        q2 = processed(teacher.logits(prompt + [a]))
        for b in np.flatnonzero(q2):
            joint[a, b] = q1[a] * q2[b] * processed(teacher.logits(prompt + [a, b]))
    return joint


def chi_square_p(samples: np.ndarray, joint: np.ndarray) -> float:
    """Pearson chi-square p-value of samples [n, d] against ``joint`` [V]*d; cells with expected < 5 pooled."""
    n = samples.shape[0]
    cells = np.ravel_multi_index(tuple(samples.reshape(n, -1).T), joint.shape)
    counts = np.bincount(cells, minlength=joint.size).astype(np.float64)
    expected = joint.ravel() * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # the pooled cell is itself small: merge it into the smallest big cell
        i = int(np.argmin(exp[:-1]))
        obs[i] += obs[-1]
        exp[i] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.fixture(scope="module")
def state():
    return random_teacher_state(CFG, seed=5, std=0.5)


@pytest.fixture(scope="module")
def joint(state):
    teacher = NumpyTeacher(state)
    joint = exact_joint(teacher)
    assert abs(joint.sum() - 1) < 1e-9
    # every context the runs can reach: top-k and top-p both cut, and no top-p boundary within 1e-4
    for context, logits in teacher.memo.items():
        z = logits.astype(np.float64) / PARAMS["temperature"]
        after_k = ref_kept(z[None], PARAMS["top_k"], 1.0)[0]
        q = np.where(after_k, np.exp(z - z.max()), 0.0)
        q /= q.sum()
        assert all(abs(q[q > qv].sum() - PARAMS["top_p"]) > 1e-4 for qv in q), context
    return joint, teacher


def batched_teacher_only(teacher: NumpyTeacher, n_runs: int = N_RUNS, position_free: bool = False) -> np.ndarray:
    """[n_runs, 3]: the teacher-only runs with seeds 0..n_runs-1 decoded side by side: at position
    P + i every run draws its token from the logits after its own prefix, with its own seed.
    ``position_free``: the wrong variant whose noise ignores the position (every draw keyed at 0)."""
    seeds = np.arange(n_runs)
    out = np.zeros((n_runs, TOKENS), np.int64)
    prefix = np.zeros((n_runs, 0), np.int64)
    for i in range(TOKENS):
        keys, inverse = np.unique(prefix, axis=0, return_inverse=True)
        table = np.stack([teacher.logits(list(PROMPT) + k.tolist()) for k in keys])
        position = 0 if position_free else PROMPT.size + i
        out[:, i] = sample_rows(table[inverse.reshape(-1)], np.full(n_runs, position),
                                SamplingParams(**PARAMS), seeds=seeds)
        prefix = out[:, :i + 1]
    return out


@pytest.fixture(scope="module")
def runs(joint):
    """(teacher-only [N_RUNS, 3], speculative [N_RUNS, 3], accepted lengths of every speculative step)."""
    _, teacher = joint
    speculative, accepted = first_tokens(teacher, speculative=True)
    return batched_teacher_only(teacher), speculative, accepted


def test_the_exact_joint_is_spread_over_many_cells(joint):
    joint, _ = joint
    assert (joint * N_RUNS >= 5).sum() >= 40 and joint.max() < 0.25


def test_batched_teacher_only_equals_the_teacher_only_loop(joint, runs):
    loop, accepted = first_tokens(joint[1], speculative=False, n_runs=N_LOOP)
    assert np.array_equal(loop, runs[0][:N_LOOP]) and set(accepted) == {0}


def test_teacher_only_sampling_follows_the_exact_joint(joint, runs):
    assert chi_square_p(runs[0], joint[0]) > P_MIN


def test_speculative_sampling_follows_the_exact_joint_and_equals_teacher_only(joint, runs):
    teacher_only, speculative, accepted = runs
    assert chi_square_p(speculative, joint[0]) > P_MIN
    assert np.array_equal(speculative, teacher_only)  # position keying: the same tokens, seed by seed
    assert np.mean(accepted) > 0.5 and max(accepted) == 2  # the tree path is exercised, to full depth


def test_temperature_applied_twice_fails_the_same_test(joint, state):
    """The teacher's logits already divided by T when the sampler divides them again."""
    wrong = batched_teacher_only(NumpyTeacher(state, scale=1 / PARAMS["temperature"]))
    assert chi_square_p(wrong, joint[0]) < P_MIN


def test_noise_keyed_without_the_position_fails_the_same_test(joint):
    wrong = batched_teacher_only(joint[1], position_free=True)
    assert chi_square_p(wrong[:, 0], joint[0].sum(axis=(1, 2))) > P_MIN  # the first token alone: right
    assert chi_square_p(wrong, joint[0]) < P_MIN
