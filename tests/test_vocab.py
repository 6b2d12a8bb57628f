"""Draft vocabulary: d2t/t2d from hand-made counts, deterministic ties, the on-disk cache, and no silent remap."""
import json
import os

import numpy as np
import pytest

from eagle_ms.train import shards as sh
from eagle_ms.train import vocab as vb
from eagle_ms.train.vocab import DraftVocab, VocabMismatchError, build_vocab, count_tokens, load_vocab, vocab_from_counts

V = 8


def test_mapping_from_hand_made_counts():
    counts = np.array([0, 5, 3, 5, 0, 3, 7, 0])  # ranking 6 (7), 1 & 3 (5), then 2 beats 5 at 3 (lower id)
    m = vocab_from_counts(counts, 4)
    assert m.used.tolist() == [1, 2, 3, 6]
    assert m.d2t.dtype == np.int64 and m.d2t.tolist() == [1, 1, 1, 3]
    assert m.t2d.dtype == bool and m.t2d.tolist() == [False, True, True, True, False, False, True, False]
    assert vocab_from_counts(counts, 1).d2t.tolist() == [6]
    # fewer distinct tokens than N: unseen ids fill by lowest id
    assert vocab_from_counts(np.array([0, 0, 9, 0, 0, 4, 0, 0]), 4).used.tolist() == [0, 1, 2, 5]
    full = vocab_from_counts(counts, V)  # N == V: identity
    assert full.d2t.tolist() == [0] * V and full.t2d.all()
    for n in range(1, V + 1):  # target = draft + d2t[draft] round-trips through t2d
        m = vocab_from_counts(counts, n)
        draft = np.arange(n)
        assert m.t2d[draft + m.d2t].all() and m.validate("x") is m
    with pytest.raises(ValueError, match="draft_vocab_size 9"):
        vocab_from_counts(counts, 9)


def test_counts_only_assistant_positions_and_bad_mapping_is_named():
    seqs = [([1, 2, 3, 3], [0, 1, 1, 1]), ([3, 7, 7], [1, 0, 1])]
    assert count_tokens(seqs, V).tolist() == [0, 0, 1, 3, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="token id 9 is outside"):
        count_tokens([([9], [1])], V)
    with pytest.raises(ValueError, match="bad.safetensors is invalid"):
        DraftVocab(np.array([0, 0]), np.array([True, False, True])).validate("bad.safetensors")


def _regen_file(path, rows, vocab_size=V):
    with open(path, "w") as fh:
        for i, (ids, mask) in enumerate(rows):
            fh.write(json.dumps({"id": f"c{i}", "index": i, "ids": ids, "assistant_mask": mask}) + "\n")
    with open(str(path) + ".meta.json", "w") as fh:
        json.dump({"vocab_size": vocab_size, "tokenizer_sha256": "tok"}, fh)


ROWS = [([1, 2, 3, 3, 6], [0, 1, 1, 1, 1]), ([6, 6, 5, 7, 7], [1, 1, 1, 0, 0])]  # counts: 6:3, 3:2, 2:1, 5:1


def test_cache_is_reused_without_recounting(tmp_path, monkeypatch):
    data = tmp_path / "regen.jsonl"
    _regen_file(data, ROWS)
    first = build_vocab(str(data), 3, str(tmp_path / "a.safetensors"), log=lambda m: None)
    assert first.status == "created" and not first.from_cache
    assert first.vocab.used.tolist() == [2, 3, 6] and first.coverage == pytest.approx(6 / 7)
    cache = os.listdir(tmp_path / "vocab-cache")
    assert len(cache) == 1 and cache[0] == f"vocab-{first.key[:16]}.safetensors"
    stat = os.stat(tmp_path / "vocab-cache" / cache[0])

    def no_counting(*a, **k):
        raise AssertionError("recounted although the cache holds this key")

    monkeypatch.setattr(vb, "count_tokens", no_counting)
    second = build_vocab(str(data), 3, str(tmp_path / "b.safetensors"), log=lambda m: None)
    assert second.from_cache and second.status == "created" and second.vocab.equals(first.vocab)
    assert os.stat(tmp_path / "vocab-cache" / cache[0]).st_mtime_ns == stat.st_mtime_ns
    out_stat = os.stat(tmp_path / "a.safetensors")  # rerun on an existing --out: unchanged, not rewritten
    assert build_vocab(str(data), 3, str(tmp_path / "a.safetensors"), log=lambda m: None).status == "unchanged"
    assert os.stat(tmp_path / "a.safetensors").st_mtime_ns == out_stat.st_mtime_ns
    with pytest.raises(AssertionError, match="recounted"):  # another N is another key
        build_vocab(str(data), 2, str(tmp_path / "c.safetensors"), log=lambda m: None)


def test_existing_mapping_is_never_silently_remapped(tmp_path):
    data = tmp_path / "regen.jsonl"
    _regen_file(data, ROWS)
    out = str(tmp_path / "vocab.safetensors")
    old = build_vocab(str(data), 3, out, log=lambda m: None).vocab  # [2, 3, 6]
    _regen_file(data, ROWS + [([1, 1, 1, 1], [1, 1, 1, 1])])  # more data: token 1 now ranks first
    logs = []
    kept = build_vocab(str(data), 3, out, log=logs.append)
    assert kept.status == "kept_existing" and kept.vocab.equals(old) and kept.changed_tokens == 1
    assert load_vocab(out)[0].equals(old)
    assert any("KEEPING the existing mapping" in m for m in logs)
    with pytest.raises(VocabMismatchError, match="1 ids swapped"):
        build_vocab(str(data), 3, out, verify=True, log=lambda m: None)
    # warm start from a draft checkpoint holding d2t/t2d: its mapping is attached to the new output
    draft_dir = tmp_path / "draft"
    os.makedirs(draft_dir)
    vb.save_vocab(str(draft_dir / "model.safetensors"), old, {"format": "eagle3-draft"})
    warm = build_vocab(str(data), 3, str(tmp_path / "warm.safetensors"), attach=str(draft_dir), log=lambda m: None)
    assert warm.status == "kept_existing" and load_vocab(str(tmp_path / "warm.safetensors"))[0].equals(old)
    remapped = build_vocab(str(data), 3, out, force_remap=True, log=lambda m: None)
    assert remapped.status == "remapped" and remapped.vocab.used.tolist() == [1, 3, 6]
    with pytest.raises(VocabMismatchError, match="vocabulary of 8 ids"):
        build_vocab(str(data), 3, out, vocab_size=16, log=lambda m: None)


def test_vocab_from_a_preprocessed_directory(tmp_path):
    """Counts come from the shards' input_ids/loss_mask; the data hash from the manifest alone."""
    out = str(tmp_path / "features")
    samples = []
    for ids, mask in ROWS:
        t = len(ids)
        samples.append(sh.SampleFeatures(np.array(ids, np.int32), np.array(mask, bool),
                                         np.zeros((t, 6), np.float16), np.zeros((t, 2), np.float16)))
    spec = sh.ShardSpec(0, (0, 1))
    entry = sh.write_shard(out, spec, "k0", ["c0", "c1"], samples, "float16")
    sh.write_manifest(out, {"format": sh.FORMAT, "fingerprint": {"tokenizer_sha256": "tok"}, "vocab_size": V,
                            "shards": [entry]})
    res = build_vocab(out, 3, str(tmp_path / "v.safetensors"), log=lambda m: None)
    assert res.vocab.used.tolist() == [2, 3, 6] and res.vocab.t2d.size == V
    read, index = sh.read_shard(sh.shard_path(out, 0), verify=True)
    assert index.tolist() == [0, 1] and all(a.equals(b) for a, b in zip(read, samples))


def test_a_regenerated_file_with_a_duplicated_id_is_counted_once_or_refused(tmp_path):
    data = tmp_path / "regen.jsonl"
    _regen_file(data, ROWS)
    once = build_vocab(str(data), 3, str(tmp_path / "once.safetensors"), log=lambda m: None).vocab
    with open(data, "a") as fh:  # what two writers of one run appended: the same record twice
        fh.write(open(data).read().splitlines()[1] + "\n")
    twice = build_vocab(str(data), 3, str(tmp_path / "twice.safetensors"), log=lambda m: None).vocab
    assert twice.equals(once) and once.used.tolist() == [2, 3, 6]  # counted twice it would be [3, 5, 6]
    with open(data, "a") as fh:  # the same id with another content: which one is right? refused
        fh.write(json.dumps({"id": "c0", "index": 0, "ids": [7, 7], "assistant_mask": [1, 1]}) + "\n")
    with pytest.raises(ValueError, match=rf"{data}: record id 'c0' appears on line 1 and again, different, on line 4"):
        build_vocab(str(data), 3, str(tmp_path / "bad.safetensors"), log=lambda m: None)


def test_a_shard_that_is_not_the_listed_one_is_refused(tmp_path):
    out = str(tmp_path / "features")
    ids, mask = ROWS[0]
    sample = sh.SampleFeatures(np.array(ids, np.int32), np.array(mask, bool), np.zeros((5, 6), np.float16),
                               np.zeros((5, 2), np.float16))
    entry = sh.write_shard(out, sh.ShardSpec(0, (0,)), "key-of-the-new-run", ["c0"], [sample], "float16")
    sh.write_manifest(out, {"format": sh.FORMAT, "fingerprint": {}, "vocab_size": V,
                            "shards": [{**entry, "key": "key-of-the-old-run"}]})
    with pytest.raises(sh.StaleShardError, match=rf"{sh.shard_path(out, 0)}: shard 0 has key key-of-the-new-r"):
        build_vocab(out, 3, str(tmp_path / "v.safetensors"), log=lambda m: None)
