"""Shared builders for the model-level tests: tiny seeded Pangu teachers, runners, trees, paths.

Not a conftest: test modules import it (``tests/`` is on ``sys.path`` under pytest's default import
mode because it has no ``__init__.py``). GRAPH_MODE on CPU is set by tests/conftest.py.

Weights: ``eagle_ms.weights.random_teacher_state`` / ``load_state`` (HF names -> float32 arrays), with
std ~0.3 on a tiny config so the argmax is far from constant.
"""
from __future__ import annotations

import numpy as np

from eagle_ms.config import ModelConfig
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.teacher import TeacherRunner
from eagle_ms.tree import DraftTree
from eagle_ms.weights import load_state, random_teacher_state

# 3 layers (aux layers resolve to (0, 1, 2)), GQA 4 query heads over 2 KV heads, head_dim 8, biases.
TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, bias=True)
WEIGHT_STD = 0.3


def build_teacher(capacity: int, backend: str = "eager", seed: int = 0, cfg: ModelConfig = TINY,
                  state: dict[str, np.ndarray] | None = None, std: float = WEIGHT_STD, kernels: str = "composite"):
    """A seeded tiny PanguForCausalLM (batch 1) with its weights set; returns (model, state)."""
    model = PanguForCausalLM(cfg, 1, capacity, backend, kernels=kernels)
    if state is None:
        state = random_teacher_state(cfg, seed, std)
    load_state(model, state)
    return model, state


def make_runner(model, prefill_chunk: int = 8, max_depth: int = 10) -> TeacherRunner:
    return TeacherRunner(model, prefill_chunk, max_depth + 1)


def prompt(seed: int, length: int, vocab: int = TINY.vocab_size) -> np.ndarray:
    return np.random.default_rng(1000 + seed).integers(3, vocab, size=length).astype(np.int32)


# --- hand-built trees ----------------------------------------------------------------------------

def make_tree(root: int, tokens, parents) -> DraftTree:
    return DraftTree(root, np.asarray(tokens, np.int64), np.asarray(parents, np.int64),
                     np.zeros(len(tokens)))


def chain_parents(m: int) -> list[int]:
    """[0, 1, ..., m-1]: node k's parent is k-1."""
    return list(range(m))


def star_parents(m: int) -> list[int]:
    """Every draft node is a child of the root."""
    return [0] * m


def binary_parents(m: int) -> list[int]:
    """Complete binary tree in breadth-first order: node k's parent is (k - 1) // 2.

    Example m=6: parents [0, 0, 1, 1, 2, 2] (nodes 1,2 children of root; 3,4 of 1; 5,6 of 2).
    """
    return [(k - 1) // 2 for k in range(1, m + 1)]


def random_parents(m: int, rng: np.random.Generator, max_depth: int) -> list[int]:
    """Random parent-before-child tree with depth <= max_depth."""
    depth = [0]
    parents = []
    for k in range(1, m + 1):
        choices = [j for j in range(k) if depth[j] < max_depth]
        p = int(rng.choice(choices))
        parents.append(p)
        depth.append(depth[p] + 1)
    return parents


def root_path(parents, k: int) -> list[int]:
    """Node ids from the root to node k (draft parents list, node i+1 has parent parents[i]).

    Example: parents [0, 0, 1], k=3 -> [0, 1, 3].
    """
    path = [k]
    while path[-1] != 0:
        path.append(int(parents[path[-1] - 1]))
    return path[::-1]


def leaves(parents) -> list[int]:
    m = len(parents)
    has_child = set(int(p) for p in parents)
    return [k for k in range(m + 1) if k not in has_child] or [0]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(max |b|, 1e-6)."""
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(float(np.max(np.abs(b))), 1e-6))


def float16_matrices(state: dict, cfg) -> dict:
    """A draft ``state`` with every weight matrix rounded to float16 (values float16 holds exactly, kept in
    float32, as the shipped draft's): the weights a draft with ``kernel_weight_dtype`` 'float16' accepts."""
    from eagle_ms.draft_weights import matrix_keys

    keys = set(matrix_keys(cfg))
    return {k: v.astype(np.float16).astype(np.float32) if k in keys else v for k, v in state.items()}
