"""Draft vocabulary (``eagle-ms build-vocab``): the draft predicts only the N most frequent target tokens.

Counting: target-token frequencies over assistant (loss-masked) positions of the training data, i.e.
``counts[v] = #{t : loss_mask[t] and input_ids[t] == v}``, from a preprocessed directory (its shards'
``input_ids``/``loss_mask``, so after the ``max_len`` cut) or a regenerated JSONL (``ids`` /
``assistant_mask``).

Mapping (the EAGLE-3 convention, docs/eagle3_format.md): rank every target id by (count descending, id
ascending) -- ties go to the lower id, and unseen ids (count 0) fill the list when fewer than N ids
occur -- keep the first N, sort them ascending: ``used [N]``. Then

    d2t [N] int64  d2t[i] = used[i] - i          (target = draft + d2t[draft])
    t2d [V] bool   t2d[j] = j in used

Example: counts [0, 5, 3, 5, 0, 3, 7, 0] (V=8), N=4 -> ranking 6, 1, 3, 2, 5, ... -> used [1, 2, 3, 6]
-> d2t [1, 1, 1, 3], t2d [F, T, T, T, F, F, T, F] (2 beats 5 on the tie at count 3).

Cache: ``<cache_dir>/vocab-<key16>.safetensors`` (d2t, t2d and the counts) under
key = hash(data content hash, tokenizer hash, N, V); a hit skips counting. The data content hash of a
preprocessed directory comes from its manifest (shard keys + content hashes), of a JSONL from its bytes.

No silent remap (SpecForge PR #534: a warm start that recomputed d2t collapsed acceptance): if a mapping
already exists -- ``--attach`` (a vocab file or an EAGLE-3 draft checkpoint holding d2t/t2d) or the
``--out`` file of an earlier run -- it is kept unchanged even when the data now gives another one; the
difference is reported (``verify=True`` raises ``VocabMismatchError`` instead; ``force_remap=True``
replaces it, which invalidates a draft trained with the old mapping).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from eagle_ms.train.hashing import file_sha256, json_hash
from eagle_ms.train.jsonl import read_unique_records
from eagle_ms.safetensors_format import SafetensorsFile, write_safetensors

FORMAT = "eagle_ms.draft_vocab.v1"


class VocabMismatchError(ValueError):
    """An existing draft vocabulary differs from the one the data gives (and verification was asked)."""


@dataclass(frozen=True)
class DraftVocab:
    d2t: np.ndarray  # [N] int64: target = draft + d2t[draft]
    t2d: np.ndarray  # [V] bool: target id is in the draft vocabulary

    @property
    def used(self) -> np.ndarray:
        """Target ids of draft ids 0..N-1, ascending [N]."""
        return np.arange(self.d2t.size, dtype=np.int64) + self.d2t

    def equals(self, other: "DraftVocab") -> bool:
        return np.array_equal(self.d2t, other.d2t) and np.array_equal(self.t2d, other.t2d)

    def validate(self, source: str) -> "DraftVocab":
        """Raise ValueError naming ``source`` unless d2t/t2d describe the same increasing id set."""
        used = self.used
        n, v = self.d2t.size, self.t2d.size
        problems = []
        if n < 1 or n > v:
            problems.append(f"draft vocab size {n} not in [1, V={v}]")
        elif np.any(np.diff(used) <= 0) or used[0] < 0 or used[-1] >= v:
            problems.append("d2t does not give strictly increasing target ids inside [0, V)")
        elif int(self.t2d.sum()) != n or not self.t2d[used].all():
            problems.append(f"t2d marks {int(self.t2d.sum())} ids, not the {n} ids of d2t")
        if problems:
            raise ValueError(f"draft vocabulary {source} is invalid: {problems[0]}")
        return self


def vocab_from_counts(counts: np.ndarray, draft_vocab_size: int) -> DraftVocab:
    """The mapping of the module doc from counts [V]."""
    counts = np.asarray(counts, dtype=np.int64)
    v = counts.size
    if not 1 <= draft_vocab_size <= v:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in [1, vocab size {v}]")
    order = np.lexsort((np.arange(v), -counts))  # last key is primary: count desc, then id asc
    used = np.sort(order[:draft_vocab_size]).astype(np.int64)
    t2d = np.zeros(v, dtype=bool)
    t2d[used] = True
    return DraftVocab(used - np.arange(draft_vocab_size, dtype=np.int64), t2d)


def count_tokens(sequences, vocab_size: int) -> np.ndarray:
    """counts [V] int64 of ids at mask positions; ``sequences`` yields (ids [T], mask [T])."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for ids, mask in sequences:
        ids = np.asarray(ids, dtype=np.int64)[np.asarray(mask, dtype=bool)]
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token id {int(ids.max() if ids.max() >= vocab_size else ids.min())} is outside the "
                             f"target vocabulary [0, {vocab_size})")
        counts += np.bincount(ids, minlength=vocab_size)
    return counts


# ------------------------------------------------------------------------------------ data sources

@dataclass(frozen=True)
class DataSource:
    path: str
    kind: str  # "preprocessed" | "jsonl"
    content_hash: str
    tokenizer_hash: str | None
    vocab_size: int | None

    def sequences(self):
        """(ids, mask) per sample: every listed shard, checked against its manifest key, or one per
        record id of the JSONL (``jsonl.read_unique_records``)."""
        if self.kind == "preprocessed":
            from eagle_ms.train.shards import load_manifest, open_shard, shard_path

            for entry in load_manifest(self.path)["shards"]:
                f = open_shard(shard_path(self.path, entry["id"]), entry["key"])
                yield f.read("input_ids"), f.read("loss_mask")
        else:
            for rec in read_unique_records(self.path):
                if rec.get("ids"):
                    yield rec["ids"], rec["assistant_mask"]


def open_source(path: str) -> DataSource:
    """A preprocessed directory (manifest.json) or a regenerated JSONL (with its .meta.json sidecar if any)."""
    if os.path.isdir(path):
        from eagle_ms.train.shards import data_hash, load_manifest

        m = load_manifest(path)
        return DataSource(path, "preprocessed", data_hash(m), m["fingerprint"].get("tokenizer_sha256"),
                          m.get("vocab_size"))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vocabulary data not found: {path}")
    meta = {}
    if os.path.isfile(path + ".meta.json"):
        with open(path + ".meta.json", encoding="utf-8") as fh:
            meta = json.load(fh)
    return DataSource(path, "jsonl", file_sha256(path), meta.get("tokenizer_sha256"), meta.get("vocab_size"))


# ------------------------------------------------------------------------------------ files

def save_vocab(path: str, vocab: DraftVocab, meta: dict, counts: np.ndarray | None = None) -> None:
    tensors = {"d2t": vocab.d2t.astype(np.int64), "t2d": vocab.t2d.astype(bool)}
    if counts is not None:
        tensors["counts"] = counts.astype(np.int64)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_safetensors(path, tensors, {k: json.dumps(v) for k, v in meta.items()})


def load_vocab(path: str) -> tuple[DraftVocab, dict, np.ndarray | None]:
    """(mapping, metadata, counts or None) from a vocab file or an EAGLE-3 draft checkpoint (dir or file)."""
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    f = SafetensorsFile(path)
    if "d2t" not in f.tensors or "t2d" not in f.tensors:
        raise ValueError(f"{path} holds no d2t/t2d tensors (not a draft vocabulary or an EAGLE-3 draft)")
    vocab = DraftVocab(f.read("d2t").astype(np.int64), f.read("t2d").astype(bool)).validate(path)
    meta = {}
    for k, v in f.metadata.items():
        try:
            meta[k] = json.loads(v)
        except json.JSONDecodeError:
            meta[k] = v
    return vocab, meta, f.read("counts") if "counts" in f.tensors else None


# ------------------------------------------------------------------------------------ build

@dataclass(frozen=True)
class VocabResult:
    vocab: DraftVocab
    status: str  # created | unchanged | kept_existing | remapped
    path: str
    key: str
    from_cache: bool
    changed_tokens: int  # ids in one mapping but not the other (0 when unchanged/created)
    coverage: float  # share of counted assistant tokens the RESULT mapping covers

    def summary(self) -> dict:
        return {"status": self.status, "path": self.path, "key": self.key, "from_cache": self.from_cache,
                "draft_vocab_size": int(self.vocab.d2t.size), "vocab_size": int(self.vocab.t2d.size),
                "changed_tokens": self.changed_tokens, "coverage": self.coverage}


def cached_counts_vocab(source: DataSource, n: int, vocab_size: int, cache_dir: str, log=print):
    """(mapping, counts, key, from_cache): from the cache when the key matches, else counted and cached."""
    key = json_hash({"format": FORMAT, "data": source.content_hash, "tokenizer": source.tokenizer_hash,
                     "draft_vocab_size": n, "vocab_size": vocab_size})
    path = os.path.join(cache_dir, f"vocab-{key[:16]}.safetensors")
    if os.path.isfile(path):
        vocab, meta, counts = load_vocab(path)
        if meta.get("key") == key and counts is not None:
            return vocab, counts, key, True
    counts = count_tokens(source.sequences(), vocab_size)
    vocab = vocab_from_counts(counts, n)
    save_vocab(path, vocab, _meta(key, source, vocab, counts), counts)
    log(f"[build-vocab] counted {int(counts.sum())} assistant tokens ({int((counts > 0).sum())} distinct) "
        f"-> cached {path}")
    return vocab, counts, key, False


def _meta(key: str, source: DataSource, vocab: DraftVocab, counts: np.ndarray) -> dict:
    return {"format": FORMAT, "key": key, "draft_vocab_size": int(vocab.d2t.size), "vocab_size": int(vocab.t2d.size),
            "data": os.path.abspath(source.path), "data_hash": source.content_hash,
            "tokenizer_sha256": source.tokenizer_hash, "coverage": coverage(vocab, counts)}


def coverage(vocab: DraftVocab, counts: np.ndarray) -> float:
    total = int(counts.sum())
    return float(counts[vocab.t2d].sum() / total) if total else 0.0


def build_vocab(data: str, draft_vocab_size: int, out: str, cache_dir: str | None = None, attach: str | None = None,
                verify: bool = False, force_remap: bool = False, vocab_size: int | None = None,
                log=print) -> VocabResult:
    """Compute (or reuse) the data's mapping and reconcile it with an existing one (module doc)."""
    source = open_source(data)
    v = vocab_size or source.vocab_size
    if v is None:
        raise ValueError(f"{data} does not record the target vocab size: pass --vocab-size")
    cache_dir = cache_dir or os.path.join(os.path.dirname(os.path.abspath(out)), "vocab-cache")
    fresh, counts, key, hit = cached_counts_vocab(source, draft_vocab_size, v, cache_dir, log)
    existing_path = attach or (out if os.path.exists(out) else None)
    if existing_path is None:
        save_vocab(out, fresh, _meta(key, source, fresh, counts))
        return VocabResult(fresh, "created", out, key, hit, 0, coverage(fresh, counts))
    old, _, _ = load_vocab(existing_path)
    if old.t2d.size != v:
        raise VocabMismatchError(f"existing mapping {existing_path} is for a vocabulary of {old.t2d.size} ids, "
                                 f"the data's is {v}: it cannot belong to this teacher")
    if old.equals(fresh):
        if attach and os.path.abspath(attach) != os.path.abspath(out):
            save_vocab(out, old, _meta(key, source, old, counts))
        return VocabResult(old, "unchanged", out, key, hit, 0, coverage(old, counts))
    changed = int(np.setxor1d(old.used, fresh.used).size // 2) if old.d2t.size == fresh.d2t.size else -1
    what = (f"the data's top-{draft_vocab_size} mapping differs from the existing one {existing_path} "
            f"(draft size {old.d2t.size} vs {fresh.d2t.size}, {changed} ids swapped; coverage of assistant "
            f"tokens {coverage(old, counts):.4f} existing vs {coverage(fresh, counts):.4f} new)")
    if verify:
        raise VocabMismatchError(what)
    if force_remap:
        log(f"[build-vocab] WARNING: {what}; REPLACING it (--force-remap): a draft trained with the old "
            "mapping no longer matches")
        save_vocab(out, fresh, _meta(key, source, fresh, counts))
        return VocabResult(fresh, "remapped", out, key, hit, changed, coverage(fresh, counts))
    log(f"[build-vocab] {what}; KEEPING the existing mapping unchanged (no silent remap; --verify fails here, "
        "--force-remap replaces it)")
    if attach and os.path.abspath(attach) != os.path.abspath(out):
        save_vocab(out, old, _meta(key, source, old, counts))
    return VocabResult(old, "kept_existing", out, key, hit, changed, coverage(old, counts))
