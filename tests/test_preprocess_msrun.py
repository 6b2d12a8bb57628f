"""Preprocessing under msrun (scripts/msrun_preprocess.sh) on CPU: 2 workers == 1 worker byte for byte;
a worker killed midway, then a rerun that computes only the missing shards. (Rank 0's bounded wait and
its exact missing-shard report are tested in-process in test_preprocess.py.)

The 1-worker reference runs in this process with the same YAML; the msrun runs are subprocesses
(each ~10 s on 2 shared cores: scheduler + workers import MindSpore and compile two graphs).
"""
import json
import os

import numpy as np
import pytest

from conftest import REPO
from helpers_msrun import run_msrun, tiny_teacher_yaml
from eagle_ms.config import load_config
from eagle_ms.train import shards as sh
from eagle_ms.train.preprocess import PreprocessOptions, run_preprocess

SCRIPT = os.path.join(REPO, "scripts", "msrun_preprocess.sh")
YAML = tiny_teacher_yaml("{seq_length: 32, prefill_chunk: 16, seed: 3}")
N_SAMPLES = 8  # shard size 1, 2 groups: shards 0..7; rank 0 owns the even ones, rank 1 the odd ones
ARGS = ["--shard-size", "1", "--shard-groups", "2", "--min-bucket", "16"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("msrun")
    (root / "tiny.yaml").write_text(YAML)
    rng = np.random.default_rng(11)
    with open(root / "data.jsonl", "w") as fh:
        for i in range(N_SAMPLES):
            t = int(rng.integers(6, 40))
            fh.write(json.dumps({"id": f"q{i}", "ids": rng.integers(5, 8000, t).tolist(),
                                 "assistant_mask": [0] * (t // 2) + [1] * (t - t // 2)}) + "\n")
    cfg = load_config(str(root / "tiny.yaml"))
    ref = run_preprocess(cfg, PreprocessOptions(data=str(root / "data.jsonl"), out=str(root / "ref"), shard_size=1,
                                                shard_groups=2, min_bucket=16), log=lambda m: None)
    return root, ref["manifest"]


def _msrun(root, out, env=None):
    log_dir = root / f"logs-{os.path.basename(out)}-{len(os.listdir(root))}"
    return run_msrun(SCRIPT, root, log_dir, ["--config", str(root / "tiny.yaml"), "--data", str(root / "data.jsonl"),
                                             "--out", str(out), *ARGS], env)


def _shard_files(out):
    return {i: open(sh.shard_path(str(out), i), "rb").read() for i in range(N_SAMPLES)}


def _present(out):
    """Shard id -> (inode, mtime_ns) of complete files."""
    return {i: (os.stat(p).st_ino, os.stat(p).st_mtime_ns) for i in range(N_SAMPLES)
            if os.path.exists(p := sh.shard_path(str(out), i))}


def test_two_workers_equal_one_worker(setup):
    root, ref_manifest = setup
    proc, logs = _msrun(root, root / "two")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rank id:0" in proc.stdout and "rank id:1" in proc.stdout
    assert "nothing to do" in logs["scheduler.log"]  # msrun's scheduler process runs the command too
    assert _shard_files(root / "two") == _shard_files(root / "ref")  # same bytes, shard by shard
    manifest = sh.load_manifest(str(root / "two"))
    assert manifest["shards"] == ref_manifest["shards"]
    reports = [json.load(open(root / "two" / "reports" / f"rank-{r}.json")) for r in (0, 1)]
    assert reports[0]["computed"] == [0, 2, 4, 6] and reports[1]["computed"] == [1, 3, 5, 7]


def test_killed_worker_then_rerun_completes_only_missing_shards(setup):
    root, ref_manifest = setup
    out = root / "killed"
    # rank 1 dies (exit 17) right after its first shard; msrun then kills rank 0 wherever it is
    proc, logs = _msrun(root, out, env={"EAGLE_MS_PREPROCESS_FAIL_AFTER": "1:1"})
    assert proc.returncode != 0 and not (out / "manifest.json").exists()
    before = _present(out)
    assert 1 in before and not {3, 5, 7} & set(before)  # rank 1 wrote shard 1 only
    for i in before:  # whatever exists is complete: right key, readable
        assert sh.shard_entry(sh.shard_path(str(out), i))["key"] == ref_manifest["shards"][i]["key"]
    proc, logs = _msrun(root, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.load(open(out / "reports" / f"rank-{r}.json")) for r in (0, 1)]
    computed = sorted(reports[0]["computed"] + reports[1]["computed"])
    reused = sorted(reports[0]["reused"] + reports[1]["reused"])
    assert computed == sorted(set(range(N_SAMPLES)) - set(before)) and reused == sorted(before)
    assert {i: v for i, v in _present(out).items() if i in before} == before  # reused files untouched
    assert not [n for n in os.listdir(out / "shards") if ".tmp" in n]
    assert _shard_files(out) == _shard_files(root / "ref")
    assert sh.load_manifest(str(out))["shards"] == ref_manifest["shards"]

