"""Preprocessing in one process: shard layout, features vs the teacher forward, cache reuse, online mode,
rank 0's bounded wait; one writer per rank, duplicated record ids, a manifest never left over shards of
another run. (The msrun runs are in test_preprocess_msrun.py.)"""
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from conftest import REPO
from helpers_locks import held_elsewhere
from eagle_ms.config import config_from_dict
from eagle_ms.locks import OutputInUseError
from eagle_ms.models.pangu import PanguFullSequence
from eagle_ms.train import shards as sh
from eagle_ms.train.preprocess import (ENV_FAIL_AFTER, DistEnv, FeatureExtractor, MissingShardsError, PreprocessOptions,
                                       distributed_env, length_buckets, load_samples, run_preprocess)
from mindspore import Tensor

TOKENIZER = os.path.join(REPO, "eagle_ms", "assets", "demo", "tokenizer.model")
MAX_LEN = 32
CFG = config_from_dict({
    "model": {"model_config": {"vocab_size": 8000, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "eos_token_id": 4}},
    "tokenizer": {"model_file": TOKENIZER, "chat_template": "openpangu"},
    "runtime": {"seq_length": MAX_LEN, "prefill_chunk": 16}})
YAML = f"""
model:
  model_config: {{vocab_size: 8000, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3,
                 num_attention_heads: 4, num_key_value_heads: 2, eos_token_id: 4}}
tokenizer: {{model_file: {TOKENIZER}, chat_template: openpangu}}
runtime: {{seq_length: {MAX_LEN}, prefill_chunk: 16}}
"""  # CFG as a file, for the CLI


def write_samples(path, n, seed=0, lengths=None):
    """A regenerated-format JSONL of n random samples (index field reversed: order must follow it)."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            t = lengths[i] if lengths else int(rng.integers(6, 45))
            ids = rng.integers(5, 8000, t).tolist()
            mask = [0] * (t // 3) + [1] * (t - t // 3)
            fh.write(json.dumps({"id": f"r{i}", "index": n - 1 - i, "ids": ids, "assistant_mask": mask}) + "\n")


@pytest.fixture(scope="module")
def extractor():
    return FeatureExtractor.from_config(CFG, MAX_LEN, min_bucket=16)


def _opts(tmp, **kw):
    return PreprocessOptions(**{"data": str(tmp / "data.jsonl"), "out": str(tmp / "out"), "shard_size": 2,
                                "shard_groups": 2, "min_bucket": 16, **kw})


def _quiet(_):
    pass


# ------------------------------------------------------------------------------ layout, env, samples

def test_shard_plan_example_and_rank_partition():
    plan = sh.shard_plan(7, 2, 2)
    assert [(s.id, s.samples) for s in plan] == [(0, (0, 2)), (1, (1, 3)), (2, (4, 6)), (3, (5,))]
    plan = sh.shard_plan(23, 3, 4)
    assert sorted(i for s in plan for i in s.samples) == list(range(23))
    for world in (1, 2, 4):  # rank r's shards hold exactly the samples with i % W == r
        for r in range(world):
            mine = sorted(i for s in plan if s.id % world == r for i in s.samples)
            assert mine == [i for i in range(23) if i % world == r]


def test_length_buckets_and_env():
    assert length_buckets(100, 32) == (32, 64, 100) and length_buckets(2048) == (64, 128, 256, 512, 1024, 2048)
    msrun_worker = {"MS_ROLE": "MS_WORKER", "RANK_ID": "1", "RANK_SIZE": "2", "MS_NODE_ID": "1", "DEVICE_ID": "1"}
    assert distributed_env(environ=msrun_worker) == DistEnv("worker", 1, 2)
    assert distributed_env(environ={"MS_ROLE": "MS_SCHED", "RANK_ID": "0", "RANK_SIZE": "2"}).role == "scheduler"
    assert distributed_env(environ={}) == DistEnv("worker", 0, 1)
    with pytest.raises(ValueError, match="RANK_ID is not set"):
        distributed_env(environ={"RANK_SIZE": "4"})
    with pytest.raises(ValueError, match="outside"):
        distributed_env(rank=2, world=2, environ={})


def test_samples_follow_index_and_are_cut(tmp_path):
    write_samples(tmp_path / "d.jsonl", 4, lengths=[10, 50, 3, 20])
    with open(tmp_path / "d.jsonl", "a") as fh:
        fh.write('{"id": "partial", "ids": [1, 2')  # a regeneration still writing
    samples, dropped = load_samples(str(tmp_path / "d.jsonl"), MAX_LEN, log=_quiet)
    assert [s.record_id for s in samples] == ["r3", "r2", "r1", "r0"]  # by index, not file order
    assert [s.input_ids.size for s in samples] == [20, 3, 32, 10] and dropped["truncated"] == 1


# ------------------------------------------------------------------------------ features

def test_stored_features_match_the_teacher_forward(extractor):
    """aux == fp16(full-sequence aux); hidden @ lm_head.T == the teacher's logits (fp16 precision)."""
    ids = np.random.default_rng(3).integers(5, 8000, 21).astype(np.int32)
    feats = extractor.extract(ids, np.ones(21, bool))
    t = ids.size
    full = PanguFullSequence(extractor.teacher)
    logits, aux = full(Tensor(ids[None]), Tensor(np.arange(t, dtype=np.int32)[None]),
                       Tensor(np.tril(np.ones((t, t), bool))[None]))
    logits, aux = logits.asnumpy()[0], aux.asnumpy()[0]
    assert feats.aux.dtype == np.float16 and feats.aux.shape == (t, 3 * 32) and feats.hidden.shape == (t, 32)
    np.testing.assert_allclose(feats.aux.astype(np.float32), aux, rtol=2e-3, atol=2e-3)
    head = extractor.teacher.lm_head.weight.asnumpy().T  # stored [H, V] (models/layers.py): the HF [V, H]
    recomputed = feats.hidden.astype(np.float32) @ head.T
    np.testing.assert_allclose(recomputed, logits, atol=2e-3 * np.abs(logits).max())
    assert np.array_equal(recomputed.argmax(-1), logits.argmax(-1))


def test_online_mode_equals_stored_record_and_cache_reuse(tmp_path, extractor):
    write_samples(tmp_path / "data.jsonl", 7)
    first = run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
    manifest = first["manifest"]
    assert first["report"]["computed"] == [0, 1, 2, 3] and manifest["num_samples"] == 7
    assert manifest["bytes_per_token"]["total"] == 4 + 1 + 2 * 4 * 32
    ds = sh.FeatureDataset(str(tmp_path / "out"), verify=True)
    samples, _ = load_samples(str(tmp_path / "data.jsonl"), MAX_LEN)
    for s in samples:  # online mode: the same record, bit for bit
        assert extractor.extract(s.input_ids, s.loss_mask).equals(ds[s.index])
    stat = {p: os.stat(p).st_mtime_ns for p in map(lambda i: sh.shard_path(str(tmp_path / "out"), i), range(4))}
    again = run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
    assert again["report"]["computed"] == [] and again["report"]["reused"] == [0, 1, 2, 3]
    assert {p: os.stat(p).st_mtime_ns for p in stat} == stat
    # change one sample's content: only its shard is recomputed
    lines = open(tmp_path / "data.jsonl").read().splitlines()
    rec = json.loads(lines[2])
    rec["ids"][0] += 1
    lines[2] = json.dumps(rec)
    open(tmp_path / "data.jsonl", "w").write("\n".join(lines) + "\n")
    changed = run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
    owner = next(s.id for s in sh.shard_plan(7, 2, 2) if rec["index"] in s.samples)  # global index == "index"
    assert changed["report"]["computed"] == [owner] and len(changed["report"]["reused"]) == 3


def test_rank0_reports_exactly_the_missing_shards_within_the_bounded_wait(tmp_path, extractor):
    write_samples(tmp_path / "data.jsonl", 6)
    t0 = time.time()
    with pytest.raises(MissingShardsError) as err:
        run_preprocess(CFG, _opts(tmp_path, wait_timeout=1.5, poll_s=0.2), rank=0, world=2, extractor=extractor,
                       log=_quiet)
    assert time.time() - t0 < 20
    assert err.value.missing == {1: 1, 3: 1}  # shard -> owning rank
    assert "rank 1: shards [1, 3]" in str(err.value)
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_a_failed_rank_ends_rank0s_wait_early(tmp_path, extractor):
    write_samples(tmp_path / "data.jsonl", 6)

    def rank1_fails():  # rank 1 hits an error (missing data file) while rank 0 waits
        bad = _opts(tmp_path, data=str(tmp_path / "missing.jsonl"))
        with pytest.raises(FileNotFoundError):
            run_preprocess(CFG, bad, rank=1, world=2, extractor=extractor, log=_quiet)

    timer = threading.Timer(1.0, rank1_fails)
    timer.start()
    t0 = time.time()
    with pytest.raises(MissingShardsError, match="rank failed: FileNotFoundError") as err:
        run_preprocess(CFG, _opts(tmp_path, wait_timeout=120, poll_s=0.2), rank=0, world=2, extractor=extractor,
                       log=_quiet)
    timer.join()
    assert time.time() - t0 < 30 and err.value.missing == {1: 1, 3: 1}


# ------------------------------------------------------------------------------ one writer, duplicated ids

def test_a_second_writer_of_a_rank_or_a_rank_of_another_job_is_refused(tmp_path, extractor):
    write_samples(tmp_path / "data.jsonl", 4)
    out = str(tmp_path / "out")
    for rank, world, job in ((0, 1, None), (1, 2, "msrun@h:7")):
        with held_elsewhere("dir", out, rank=rank, world=world, job=job) as pid:
            with pytest.raises(OutputInUseError, match=rf"{out} is being written by another .*pid {pid}"):
                run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
        assert os.listdir(out) == []  # no shard, no failure receipt in the other writer's directory


def test_duplicated_record_ids_are_dropped_when_identical_and_refused_when_not(tmp_path):
    path = tmp_path / "d.jsonl"
    write_samples(path, 4)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines + [lines[1]]) + "\n")  # r1 twice, as two writers of one run append it
    samples, _ = load_samples(str(path), MAX_LEN, log=_quiet)
    assert sorted(s.record_id for s in samples) == ["r0", "r1", "r2", "r3"]
    other = json.loads(lines[2])
    other["ids"][0] += 1
    path.write_text("\n".join(lines + [json.dumps(other)]) + "\n")
    with pytest.raises(ValueError, match=rf"{path}: record id 'r2' appears on line 3 and again, different, on line 5"):
        load_samples(str(path), MAX_LEN, log=_quiet)


@pytest.mark.parametrize("value", [8000, -1])
def test_an_id_outside_the_teacher_vocabulary_is_refused_naming_record_and_position(tmp_path, extractor, value):
    write_samples(tmp_path / "data.jsonl", 3)
    lines = (tmp_path / "data.jsonl").read_text().splitlines()
    bad = json.loads(lines[1])
    bad["ids"][4] = value
    (tmp_path / "data.jsonl").write_text("\n".join([lines[0], json.dumps(bad), lines[2]]) + "\n")
    with pytest.raises(ValueError) as info:
        run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
    assert str(info.value) == (f"{tmp_path / 'data.jsonl'}: record 'r1': token at position 4 is {value}: outside "
                               "the model vocabulary [0, 8000): another tokenizer?")
    assert not os.path.exists(tmp_path / "out" / sh.MANIFEST)


# ------------------------------------------------------------------------------ stale manifest

def _readers_refuse(out, error, match):
    """FeatureDataset (shards.py), ShardSource (train-draft) and build-vocab all refuse the directory."""
    from eagle_ms.train.ttt_data import ShardSource
    from eagle_ms.train.vocab import build_vocab

    for read in (lambda: sh.FeatureDataset(out), lambda: ShardSource(out),
                 lambda: build_vocab(out, 16, out + "-vocab.safetensors", log=_quiet)):
        with pytest.raises(error, match=match):
            read()


def test_a_rerun_with_other_data_that_fails_invalidates_the_manifest(tmp_path, extractor):
    """The documented "shards missing" exit: rank 0 rewrote its shards, rank 1 never came."""
    write_samples(tmp_path / "data.jsonl", 7)
    out = str(tmp_path / "out")
    run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
    old_manifest = open(os.path.join(out, sh.MANIFEST)).read()
    write_samples(tmp_path / "data.jsonl", 7, seed=1)  # other samples: every shard key changes
    with pytest.raises(MissingShardsError):
        run_preprocess(CFG, _opts(tmp_path, wait_timeout=0.5, poll_s=0.1), rank=0, world=2, extractor=extractor,
                       log=_quiet)
    assert not os.path.exists(os.path.join(out, sh.MANIFEST))  # mixed shards do not look complete
    _readers_refuse(out, FileNotFoundError, "no manifest.json")
    with open(os.path.join(out, sh.MANIFEST), "w") as fh:  # what the code before this check left behind
        fh.write(old_manifest)
    _readers_refuse(out, sh.StaleShardError, rf"{sh.shard_path(out, 0)}: shard 0 has key .* mixes two preprocessing")


def test_a_killed_rerun_with_other_settings_leaves_no_manifest(tmp_path, extractor):
    write_samples(tmp_path / "data.jsonl", 6)
    out = str(tmp_path / "out")
    run_preprocess(CFG, _opts(tmp_path), extractor=extractor, log=_quiet)
    (tmp_path / "cfg.yaml").write_text(YAML)
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": REPO, ENV_FAIL_AFTER: "0:1"}  # killed after one shard
    cmd = [sys.executable, "-m", "eagle_ms.cli", "preprocess", "--config", str(tmp_path / "cfg.yaml"), "--data",
           str(tmp_path / "data.jsonl"), "--out", out, "--shard-size", "2", "--shard-groups", "2",
           "--min-bucket", "16", "--max-len", "24"]  # another max length than the first run's 32
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 17, proc.stderr[-2000:]
    assert not os.path.exists(os.path.join(out, sh.MANIFEST))
    vocab = subprocess.run([sys.executable, "-m", "eagle_ms.cli", "build-vocab", "--data", out, "--draft-vocab-size",
                            "16", "--out", str(tmp_path / "v.safetensors")], capture_output=True, text=True,
                           env={**env, ENV_FAIL_AFTER: ""}, timeout=120)
    assert vocab.returncode == 2 and vocab.stderr.startswith(f"eagle-ms build-vocab: error: no manifest.json in {out}")
