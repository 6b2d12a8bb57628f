"""YAML reading (eagle_ms/config_yaml.py) against MindFormers' own MindFormerConfig, run in a subprocess,
plus what MindFormers does not do: cycles, per-file relative paths, top-level typos, bad overrides,
and a quiet stdout with no stray directories."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from eagle_ms.config import load_config
from eagle_ms.config_yaml import PATH_KEYS, apply_overrides, parse_overrides, read_yaml

CONFIGS = os.path.join(REPO, "configs")
OURS = ("model", "tokenizer", "runtime", "generation", "speculative")
MINDFORMERS_READER = """
import json, sys
from mindformers.tools.register.config import MindFormerConfig
out = []
for path, overrides in json.loads(sys.argv[1]):
    cfg = MindFormerConfig(path)
    if overrides:
        cfg.merge_from_dict(overrides)
    out.append(cfg.to_dict())
print("RESULT" + json.dumps(out))
"""
SHIPPED = ("tiny.yaml", "demo.yaml", "pangu_embedded_7b.yaml", "pangu_embedded_1b.yaml")
CHAIN_OVERRIDES = {"runtime.seed": 5, "speculative.top_k": 2, "generation.max_new_tokens": 9}


def mindformers_dicts(work, jobs):
    """MindFormers' dict of each (path, overrides) job, all read in ONE subprocess (importing MindFormers
    takes seconds; it never runs in the test process)."""
    script = work / "mf_reader.py"
    script.write_text(MINDFORMERS_READER)
    proc = subprocess.run([sys.executable, str(script), json.dumps(jobs)], cwd=str(work),
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, GLOG_v="3"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def without_paths(data):
    out = {k: dict(data[k]) for k in OURS if k in data}
    for section, key in PATH_KEYS:
        out.get(section, {}).pop(key, None)
    return out


def write(path, text):
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """child -> [base_a, base_b] in another directory, with nested overrides."""
    root = tmp_path_factory.mktemp("chain")
    (root / "bases").mkdir()
    write(root / "bases" / "a.yaml", open(os.path.join(CONFIGS, "tiny.yaml")).read())
    write(root / "bases" / "b.yaml", "runtime:\n  seq_length: 256\n  prefill_chunk: 16\n")
    return write(root / "child.yaml", "base_config: [bases/a.yaml, bases/b.yaml]\n"
                 "model:\n  model_config:\n    num_hidden_layers: 3\nspeculative:\n  budget: 8\n")


@pytest.fixture(scope="module")
def mindformers(tmp_path_factory, chain):
    """Config name -> MindFormers' reading: every shipped config, and "chain" with CHAIN_OVERRIDES."""
    jobs = [[os.path.join(CONFIGS, name), {}] for name in SHIPPED] + [[str(chain), CHAIN_OVERRIDES]]
    return dict(zip(SHIPPED + ("chain",), mindformers_dicts(tmp_path_factory.mktemp("mf"), jobs)))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_read_as_mindformers_reads_them(mindformers, name):
    path = os.path.join(CONFIGS, name)
    assert without_paths(read_yaml(path)) == without_paths(mindformers[name])


def test_inheritance_and_overrides_match_mindformers(mindformers, chain):
    ours = apply_overrides(read_yaml(str(chain)), CHAIN_OVERRIDES)
    assert without_paths(ours) == without_paths(mindformers["chain"])
    assert ours["model"]["model_config"]["num_hidden_layers"] == 3 and ours["model"]["model_config"]["hidden_size"] == 64
    assert ours["runtime"]["seq_length"] == 256 and ours["speculative"]["budget"] == 8


def test_a_config_outside_the_repo_inherits_a_shipped_one(tmp_path):
    child = write(tmp_path / "mine.yaml", f"base_config: {os.path.join(CONFIGS, 'demo.yaml')}\n"
                  "generation:\n  max_new_tokens: 7\n")
    cfg = load_config(str(child))
    assets = os.path.join(REPO, "eagle_ms", "assets", "demo")
    assert os.path.samefile(cfg.checkpoint, os.path.join(assets, "teacher"))
    assert os.path.samefile(cfg.tokenizer.model_file, os.path.join(assets, "tokenizer.model"))
    assert os.path.samefile(cfg.speculative.draft_path, os.path.join(assets, "draft"))
    assert cfg.generation.max_new_tokens == 7


def test_base_config_cycle_is_named(tmp_path):
    write(tmp_path / "a.yaml", "base_config: b.yaml\n")
    write(tmp_path / "b.yaml", "base_config: c.yaml\n")
    write(tmp_path / "c.yaml", "base_config: a.yaml\n")
    with pytest.raises(ValueError, match=r"base_config cycle: .*a\.yaml -> .*b\.yaml -> .*c\.yaml -> .*a\.yaml"):
        load_config(str(tmp_path / "a.yaml"))
    with pytest.raises(FileNotFoundError, match=r"missing\.yaml \(base_config of"):
        load_config(str(write(tmp_path / "d.yaml", "base_config: missing.yaml\n")))


def test_top_level_typos_are_errors(tmp_path):
    tiny = os.path.join(CONFIGS, "tiny.yaml")
    with pytest.raises(ValueError, match=r"'runtim' = .*unknown top-level section \(did you mean 'runtime'\?\)"):
        load_config(tiny, parse_overrides(["runtim.seq_length=16"]))
    typo = write(tmp_path / "typo.yaml", open(tiny).read() + "speculativ:\n  budget: 4\n")
    with pytest.raises(ValueError, match="'speculativ'.*did you mean 'speculative'"):
        load_config(str(typo))
    load_config(str(write(tmp_path / "mf.yaml", open(tiny).read() + "context:\n  mode: 0\n")))  # MindFormers' own
    with pytest.raises(ValueError, match="'runtime' = 5: must be a mapping"):
        load_config(tiny, parse_overrides(["runtime=5"]))


@pytest.mark.parametrize("item, match", [("=5", "key is empty"), ("runtime.=5", "empty part"),
                                         ("runtime.seq_length", "expected KEY=VALUE"),
                                         ("runtime.seq_length=[1", "not valid YAML")])
def test_bad_overrides_are_named(item, match):
    with pytest.raises(ValueError, match=match):
        parse_overrides([item])


@pytest.mark.parametrize("text, match", [("model: [1, 2\n", "not valid YAML"), ("- 1\n- 2\n", "must be a mapping"),
                                         ("base_config: 5\n", "base_config must be a file name")])
def test_malformed_yaml_files_are_named(tmp_path, text, match):
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ValueError, match=match) as info:
        load_config(str(path))
    assert "bad.yaml" in str(info.value)


def test_binary_yaml_is_named(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(ValueError, match="bin.yaml is not UTF-8"):
        load_config(str(path))


def test_stdout_carries_only_the_answer_and_no_directory_is_left(tmp_path):
    work = tmp_path / "empty"
    work.mkdir()
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-m", "eagle_ms.cli", "generate", "--config", os.path.join(CONFIGS, "tiny.yaml"),
                           "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--json"], cwd=str(work),
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["prompt_tokens"] == 3
    assert os.listdir(work) == []


def test_an_override_does_not_hide_a_damaged_section(tmp_path):
    bad = write(tmp_path / "bad.yaml", open(os.path.join(CONFIGS, "tiny.yaml")).read() + "generation: 5\n")
    with pytest.raises(ValueError, match="'generation' = 5: must be a mapping"):
        load_config(str(bad), {"generation.max_new_tokens": 2})
