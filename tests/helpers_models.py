"""Shared builders for the model-level tests: tiny seeded Pangu teachers, runners, trees, paths.

Not a conftest: test modules import it (``tests/`` is on ``sys.path`` under pytest's default import
mode because it has no ``__init__.py``).

Weights: ``eagle_ms.weights.random_teacher_state`` / ``load_state`` when that module provides them,
otherwise ``random_state`` / ``set_state`` below (same contract: HF parameter names -> float32 arrays).
Weight std ~0.25 on a tiny config so the argmax is far from constant.
"""
from __future__ import annotations

import numpy as np

import mindspore as ms
from mindspore import Tensor

from eagle_ms.config import ModelConfig
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.teacher import TeacherRunner
from eagle_ms.tree import DraftTree

# 3 layers (aux layers resolve to (0, 1, 2)), GQA 4 query heads over 2 KV heads, head_dim 8, biases.
TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, bias=True)
WEIGHT_STD = 0.25


def random_state(cfg: ModelConfig, model, seed: int, std: float = WEIGHT_STD) -> dict[str, np.ndarray]:
    """Seeded random float32 arrays for every non-cache parameter of ``model`` (by HF name).

    Norm weights are 1 + noise (so they stay positive scales), everything else N(0, std).
    """
    rng = np.random.default_rng(seed)
    state = {}
    for name, param in model.parameters_and_names():
        if "cache" in name:
            continue
        shape = tuple(param.shape)
        if "norm" in name:
            state[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            state[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return state


def set_state(model, state: dict[str, np.ndarray]) -> None:
    """Assign ``state`` by parameter name; every non-cache parameter must be covered."""
    seen = set()
    for name, param in model.parameters_and_names():
        if "cache" in name:
            continue
        if name not in state:
            raise KeyError(f"no value for parameter {name}")
        value = np.asarray(state[name], dtype=np.float32)
        if value.shape != tuple(param.shape):
            raise ValueError(f"{name}: value shape {value.shape} != parameter shape {tuple(param.shape)}")
        param.set_data(Tensor(value))
        seen.add(name)
    extra = set(state) - seen
    if extra:
        raise KeyError(f"state has unknown keys {sorted(extra)[:5]}")


def _weights_api():
    """(random_teacher_state, load_state) from eagle_ms.weights, or None while it does not exist."""
    try:
        from eagle_ms import weights
    except ImportError:
        return None
    fns = (getattr(weights, "random_teacher_state", None), getattr(weights, "load_state", None))
    return fns if all(fns) else None


def teacher_state(cfg: ModelConfig, model, seed: int, std: float = WEIGHT_STD) -> dict[str, np.ndarray]:
    api = _weights_api()
    if api is not None:
        return {k: np.asarray(v, np.float32) for k, v in api[0](cfg, seed, std).items()}
    return random_state(cfg, model, seed, std)


def load(model, state: dict[str, np.ndarray]) -> None:
    api = _weights_api()
    if api is not None:
        api[1](model, state)
    else:
        set_state(model, state)


def build_teacher(capacity: int, backend: str = "eager", seed: int = 0, cfg: ModelConfig = TINY,
                  state: dict[str, np.ndarray] | None = None, std: float = WEIGHT_STD):
    """A seeded tiny PanguForCausalLM (batch 1) with its weights set; returns (model, state)."""
    model = PanguForCausalLM(cfg, 1, capacity, backend)
    if state is None:
        state = teacher_state(cfg, model, seed, std)
    load(model, state)
    return model, state


def make_runner(model, prefill_chunk: int = 8, max_depth: int = 10) -> TeacherRunner:
    return TeacherRunner(model, prefill_chunk, max_depth + 1)


def graph_mode() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")


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
    """Heap order: node k (1-based) has parent k // 2 ... shifted so node 1 and 2 hang off the root.

    Example m=6: parents [0, 0, 1, 1, 2, 2] (nodes 1,2 children of root; 3,4 of 1; 5,6 of 2).
    """
    return [0 if k <= 2 else (k - 1) // 2 for k in range(1, m + 1)]


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


def tree_depth(parents) -> int:
    return max((len(root_path(parents, k)) - 1 for k in range(len(parents) + 1)), default=0)


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(max |b|, 1e-6)."""
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / max(float(np.max(np.abs(b))), 1e-6))
