"""Config: YAML with base_config inheritance (eagle_ms/config_yaml.py), validation errors naming key and value,
HF config.json round trip, and the shipped configs."""
import json
import os

import pytest

from eagle_ms.config import ModelConfig, config_from_dict, load_config
from eagle_ms.hf_config import model_config_from_hf, model_config_to_hf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE = {"model": {"model_config": {"vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
                                   "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2}}}


@pytest.mark.parametrize("name", ["tiny.yaml", "demo.yaml", "pangu_embedded_1b.yaml", "pangu_embedded_7b.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(os.path.join(REPO, "configs", name))
    assert cfg.model.head_dim * cfg.model.num_attention_heads >= cfg.model.hidden_size // 2
    assert len(cfg.model.aux_layer_ids) == 3


def test_openpangu_7b_shapes_and_aux_layers():
    m = load_config(os.path.join(REPO, "configs", "pangu_embedded_7b.yaml")).model
    assert (m.hidden_size, m.intermediate_size, m.num_hidden_layers) == (4096, 12800, 34)
    assert (m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (32, 8, 128)
    assert (m.vocab_size, m.rope_theta, m.eos_token_id, m.bias) == (153376, 1.6e7, 45892, True)
    assert m.aux_layer_ids == (2, 17, 31)  # inputs of layers 2, N//2, N-3 for N = 34


def test_base_config_inheritance_and_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("run_mode: predict\nmodel:\n  model_config:\n    vocab_size: 100\n    hidden_size: 32\n"
                    "    intermediate_size: 64\n    num_hidden_layers: 4\n    num_attention_heads: 4\n"
                    "    num_key_value_heads: 2\nruntime:\n  seq_length: 256\n")
    child = tmp_path / "child.yaml"
    child.write_text("base_config: base.yaml\nruntime:\n  seq_length: 128\nspeculative:\n  budget: 8\n")
    cfg = load_config(str(child), {"speculative.max_depth": 5})
    assert cfg.model.hidden_size == 32  # inherited
    assert cfg.runtime.seq_length == 128  # child wins
    assert (cfg.speculative.budget, cfg.speculative.max_depth) == (8, 5)  # child + override


@pytest.mark.parametrize("path, value, key", [
    (("model", "model_config", "hidden_size"), 30, "model.model_config.hidden_size"),
    (("model", "model_config", "num_key_value_heads"), 3, "model.model_config.num_key_value_heads"),
    (("model", "model_config", "compute_dtype"), "fp8", "model.model_config.compute_dtype"),
    (("model", "model_config", "eos_token_id"), 100, "model.model_config.eos_token_id"),
    (("model", "model_config", "bias"), "yes", "model.model_config.bias"),
    (("model", "model_config", "hiden_size"), 32, "model.model_config.hiden_size"),
    (("runtime", "seq_length"), 1, "runtime.seq_length"),
    (("runtime", "prefill_chunk"), 4096, "runtime.prefill_chunk"),
    (("runtime", "exec_mode"), "eager", "runtime.exec_mode"),
    (("speculative", "budget"), 0, "speculative.budget"),
    (("speculative", "mode"), "fast", "speculative.mode"),
    (("speculative", "draft"), "medusa", "speculative.draft"),
    (("speculative", "test_draft_error_rate"), 1.5, "speculative.test_draft_error_rate"),
    (("speculative", "min_path_prob"), 1.0, "speculative.min_path_prob"),
    (("speculative", "min_path_prob"), -0.5, "speculative.min_path_prob"),
    (("speculative", "score_temperature"), 0.0, "speculative.score_temperature"),
    (("speculative", "score_temperature"), -1.0, "speculative.score_temperature"),
    (("speculative", "score_temperature"), float("inf"), "speculative.score_temperature"),
    (("speculative", "score_temperature"), "low", "speculative.score_temperature"),
    (("speculative", "score_temperature"), True, "speculative.score_temperature"),
    (("speculative", "shallow_depth"), 0, "speculative.shallow_depth"),
    (("speculative", "shallow_depth"), 10, "speculative.shallow_depth"),  # = max_depth (default 10)
    (("speculative", "shallow_depth"), 2.5, "speculative.shallow_depth"),
    (("speculative", "shallow_depth"), True, "speculative.shallow_depth"),
    (("model", "model_config", "rope_theta"), float("inf"), "model.model_config.rope_theta"),
    (("speculative", "fallback_accept"), -1.0, "speculative.fallback_accept"),
    (("speculative", "fallback_accept"), "high", "speculative.fallback_accept"),
    (("speculative", "fallback_steps"), 0, "speculative.fallback_steps"),
    (("speculative", "fallback_steps"), 2.5, "speculative.fallback_steps"),
    (("generation", "max_new_tokens"), -1, "generation.max_new_tokens"),
    (("runtime", "sequence_length"), 10, "runtime.sequence_length"),
])
def test_bad_values_name_key_and_value(path, value, key):
    data = json.loads(json.dumps(BASE))
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    with pytest.raises(ValueError) as err:
        config_from_dict(data)
    assert key in str(err.value) and repr(value) in str(err.value)


def test_cross_checks_budget_and_depth_fit_capacity():
    data = json.loads(json.dumps(BASE))
    data["runtime"] = {"seq_length": 16, "prefill_chunk": 8}
    data["speculative"] = {"draft": "test", "budget": 16}
    with pytest.raises(ValueError, match="speculative.budget"):
        config_from_dict(data)
    data["speculative"] = {"max_depth": 16}
    with pytest.raises(ValueError, match="speculative.max_depth"):
        config_from_dict(data)


def test_fallback_auto_gives_each_session_a_cost_model():
    from eagle_ms.fallback import StepCosts
    from eagle_ms.runtime import decode_settings

    data = json.loads(json.dumps(BASE))
    data["speculative"] = {"draft": "test", "fallback_accept": "auto"}
    cfg = config_from_dict(data)
    assert cfg.speculative.fallback_accept == "auto"
    first, second = decode_settings(cfg), decode_settings(cfg)
    assert isinstance(first.step_costs, StepCosts) and first.step_costs is not second.step_costs
    data["speculative"]["fallback_accept"] = 2.5
    assert decode_settings(config_from_dict(data)).step_costs is None


def test_shallow_depth_gives_the_shallow_tree_to_the_decode_settings():
    from eagle_ms.drafting import TreeParams
    from eagle_ms.runtime import decode_settings

    data = json.loads(json.dumps(BASE))
    data["speculative"] = {"draft": "test", "budget": 24, "max_depth": 10, "top_k": 2, "shallow_depth": 4}
    assert decode_settings(config_from_dict(data)).shallow == TreeParams(14, 4, 2)  # 2 + 3 * 2^2 nodes
    data["speculative"]["shallow_depth"] = 8
    assert decode_settings(config_from_dict(data)).shallow == TreeParams(24, 8, 2)  # 30 candidates > M
    data["speculative"]["shallow_depth"] = None
    assert decode_settings(config_from_dict(data)).shallow is None
    data["speculative"] = {"draft": "none", "shallow_depth": 4}
    assert decode_settings(config_from_dict(data)).shallow is None


def test_eagle3_requires_draft_path():
    data = json.loads(json.dumps(BASE))
    data["speculative"] = {"draft": "eagle3"}
    with pytest.raises(ValueError, match="speculative.draft_path"):
        config_from_dict(data)


def test_missing_file_and_missing_model_section(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ValueError, match="model.model_config"):
        config_from_dict({"runtime": {}})


def test_hf_config_json_round_trip_and_openpangu_spelling(tmp_path):
    cfg = ModelConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                      num_attention_heads=4, num_key_value_heads=2, rope_theta=16e6, bias=True)
    (tmp_path / "config.json").write_text(json.dumps(model_config_to_hf(cfg)))
    back = model_config_from_hf(str(tmp_path))
    assert back == cfg
    # openPangu's own config.json: eos as an int, "bias", no aux ids -> defaults (2, L//2, L-3)
    raw = {"architectures": ["PanguEmbeddedForCausalLM"], "vocab_size": 100, "hidden_size": 32,
           "intermediate_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
           "rope_theta": 16000000.0, "bias": True, "eos_token_id": 45, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    m = model_config_from_hf(str(tmp_path), compute_dtype="bfloat16")
    assert (m.bias, m.eos_token_id, m.aux_layer_ids, m.compute_dtype) == (True, 45, (2, 4, 5), "bfloat16")
    # Llama spelling attention_bias
    raw.pop("bias")
    raw["attention_bias"] = False
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert model_config_from_hf(str(tmp_path)).bias is False


def test_hf_config_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        model_config_from_hf(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        model_config_from_hf(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json: not a JSON object"):
        model_config_from_hf(str(tmp_path))


@pytest.mark.parametrize("key,setter", [("dispatch_threads", "set_dispatch_threads"),
                                        ("op_threads", "set_op_threads")])
def test_thread_counts_are_set_once_per_process(key, setter):
    """The same number again is a no-op, another is refused naming the key (in a fresh process: the setting
    is process-wide); the config key takes None or an integer >= 1."""
    import subprocess
    import sys

    code = (f"from eagle_ms.runtime import {setter} as s\ns(2)\ns(2)\ntry:\n    s(3)\n"
            "except ValueError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": REPO}).stdout
    assert f"runtime.{key}' = 3" in out and "already runs with 2" in out
    data = json.loads(json.dumps(BASE))
    for bad in (0, 1.5, "two"):
        data["runtime"] = {key: bad}
        with pytest.raises(ValueError, match=f"runtime.{key}"):
            config_from_dict(data)
    assert getattr(load_config(os.path.join(REPO, "configs", "demo.yaml")).runtime, key) is None
