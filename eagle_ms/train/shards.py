"""On-disk format of preprocessed draft-training features: shard layout, shard files, manifest, reader.

Layout (independent of the world size). Samples have global indices ``0..n-1``. With ``G`` shard groups
and ``N`` samples per shard, shard ``s`` belongs to group ``c = s % G`` and holds block ``j = s // G`` of
that group's samples:

    shard s = [i for t in range(N) if (i := c + G * (j * N + t)) < n]

so sample ``i`` lives in shard ``(i % G) + G * ((i // G) // N)``. Rank ``r`` of ``W`` workers (``W``
divides ``G``) processes the shards with ``s % W == r`` -- exactly the samples with ``i % W == r``.
Because the layout depends on ``G`` and not on ``W``, 1, 2, 4 or 8 workers write identical shards and
a rerun with another world size reuses them. Example: n=7, G=2, N=2 -> shard 0 = [0, 2], 1 = [1, 3],
2 = [4, 6], 3 = [5]; with W=2 rank 0 writes shards 0, 2 and rank 1 shards 1, 3.

Shard file ``shards/shard-<s:06d>.safetensors`` (written to a temp name, then renamed), tensors:

    input_ids   int32   [K]        the K tokens of the shard's samples, concatenated
    loss_mask   bool    [K]        assistant tokens (the loss positions)
    aux         f16     [K, 3H]    teacher hidden states entering aux_layer_ids (low, mid, high)
    hidden      f16     [K, H]     teacher final-norm hidden state: logits = hidden @ lm_head.T
    offsets     int64   [n_s + 1]  sample k is rows offsets[k]:offsets[k+1]
    sample_index int64  [n_s]      global sample indices

(``aux``/``hidden`` are BF16 with ``feature_dtype: bfloat16``.) Metadata (strings): ``format``,
``key`` (the cache key), ``shard``, ``content_sha256`` (``array_hash`` of the six tensors as read
back), ``record_ids`` (JSON list), ``tokens``, ``loss_tokens``. A shard is complete iff its file exists
with the expected key: the rename is the commit. A run that rewrites a shard first removes
``manifest.json`` (``invalidate_manifest``), and readers check every shard's key against its manifest
entry, so a directory mixing two runs is never read as complete.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from eagle_ms.files import write_json_atomic
from eagle_ms.train.hashing import array_hash, json_hash
from eagle_ms.safetensors_format import CheckpointError, SafetensorsFile, float32_to_bf16_bits, write_safetensors

FORMAT = "eagle_ms.features.v1"
MANIFEST = "manifest.json"
SHARD_DIR = "shards"
FEATURE_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class SampleFeatures:
    """One sample as stored (and as the online mode returns it). T tokens, H teacher hidden size."""

    input_ids: np.ndarray  # [T] int32
    loss_mask: np.ndarray  # [T] bool
    aux: np.ndarray  # [T, 3H] float16 (bfloat16 storage: float32 holding bf16-rounded values)
    hidden: np.ndarray  # [T, H] same dtype as aux

    def equals(self, other: "SampleFeatures") -> bool:
        return all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in
                   zip((self.input_ids, self.loss_mask, self.aux, self.hidden),
                       (other.input_ids, other.loss_mask, other.aux, other.hidden)))


def to_feature_dtype(x: np.ndarray, feature_dtype: str) -> np.ndarray:
    """fp32 features -> the stored precision (fp16, or fp32 rounded to bf16); raises on fp16 overflow."""
    if feature_dtype == "float16":
        out = x.astype(np.float16)
        if not np.all(np.isfinite(out)) and np.all(np.isfinite(x)):
            raise ValueError(f"teacher features overflow float16 (max |x| = {float(np.max(np.abs(x))):.3g}); "
                             "use feature_dtype bfloat16")
        return out
    if feature_dtype == "bfloat16":
        return (float32_to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)
    raise ValueError(f"feature_dtype {feature_dtype!r} must be one of {FEATURE_DTYPES}")


# ------------------------------------------------------------------------------------ layout

@dataclass(frozen=True)
class ShardSpec:
    id: int
    samples: tuple[int, ...]  # global sample indices, increasing


def shard_plan(num_samples: int, shard_size: int, groups: int) -> list[ShardSpec]:
    """All non-empty shards in id order (see module doc)."""
    if shard_size < 1 or groups < 1:
        raise ValueError(f"shard_size {shard_size} and shard_groups {groups} must be >= 1")
    specs = []
    for c in range(min(groups, num_samples)):
        members = list(range(c, num_samples, groups))
        for j in range(0, len(members), shard_size):
            specs.append(ShardSpec(c + groups * (j // shard_size), tuple(members[j:j + shard_size])))
    return sorted(specs, key=lambda s: s.id)


def shard_path(out_dir: str, shard_id: int) -> str:
    return os.path.join(out_dir, SHARD_DIR, f"shard-{shard_id:06d}.safetensors")


def shard_key(base_key: str, samples: list[tuple[int, str, str]]) -> str:
    """Cache key of a shard: the run fingerprint's hash + (global index, record id, content hash) per sample."""
    return json_hash({"base": base_key, "samples": [list(s) for s in samples]})


# ------------------------------------------------------------------------------------ shard files

def _tensors(samples: list[SampleFeatures], indices) -> dict[str, np.ndarray]:
    lengths = [s.input_ids.size for s in samples]
    return {
        "input_ids": np.concatenate([s.input_ids for s in samples]).astype(np.int32),
        "loss_mask": np.concatenate([s.loss_mask for s in samples]).astype(bool),
        "aux": np.concatenate([s.aux for s in samples]),
        "hidden": np.concatenate([s.hidden for s in samples]),
        "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "sample_index": np.asarray(indices, dtype=np.int64),
    }


def write_shard(out_dir: str, spec: ShardSpec, key: str, record_ids: list[str], samples: list[SampleFeatures],
                feature_dtype: str) -> dict:
    """Write one shard atomically; returns its manifest entry."""
    tensors = _tensors(samples, spec.samples)
    meta = {"format": FORMAT, "key": key, "shard": str(spec.id), "content_sha256": array_hash(*tensors.values()),
            "record_ids": json.dumps(record_ids, ensure_ascii=False), "tokens": str(tensors["input_ids"].size),
            "loss_tokens": str(int(tensors["loss_mask"].sum())), "feature_dtype": feature_dtype}
    path = shard_path(out_dir, spec.id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_safetensors(path, tensors, meta, float_dtype=None if feature_dtype == "float16" else feature_dtype)
    return shard_entry(path)


def shard_metadata(path: str) -> dict | None:
    """The metadata of a complete shard file, or None if it is missing or unreadable (header only)."""
    if not os.path.isfile(path):
        return None
    try:
        return SafetensorsFile(path).metadata
    except CheckpointError:
        return None


def shard_entry(path: str) -> dict:
    """The manifest entry of a complete shard file (header + the small sample_index tensor)."""
    f = SafetensorsFile(path)
    meta = f.metadata
    return {"id": int(meta["shard"]), "file": os.path.join(SHARD_DIR, os.path.basename(path)), "key": meta["key"],
            "content_sha256": meta["content_sha256"], "tokens": int(meta["tokens"]),
            "loss_tokens": int(meta["loss_tokens"]), "bytes": os.path.getsize(path),
            "samples": f.read("sample_index").tolist(), "record_ids": json.loads(meta["record_ids"])}


class StaleShardError(ValueError):
    """A shard file is not the one the manifest lists: the directory mixes two preprocessing runs."""


def open_shard(path: str, key: str | None = None) -> SafetensorsFile:
    """The shard file at ``path``; with ``key`` (its manifest entry's), ``StaleShardError`` naming the shard
    unless the file carries exactly that key."""
    f = SafetensorsFile(path)
    if key is not None and f.metadata.get("key") != key:
        raise StaleShardError(f"{path}: shard {f.metadata.get('shard')} has key {str(f.metadata.get('key'))[:16]}, "
                              f"its manifest entry key {key[:16]}: this directory mixes two preprocessing runs "
                              "(one was interrupted); rerun `eagle-ms preprocess` into it, or use another one")
    return f


def read_shard(path: str, verify: bool = False, key: str | None = None) -> tuple[list[SampleFeatures], np.ndarray]:
    """(samples, global indices) of one shard; ``verify`` recomputes content_sha256; ``key``: see ``open_shard``."""
    f = open_shard(path, key)
    t = {k: f.read(k) for k in ("input_ids", "loss_mask", "aux", "hidden", "offsets", "sample_index")}
    if verify and array_hash(*t.values()) != f.metadata["content_sha256"]:
        raise CheckpointError(f"{path}: content does not match its content_sha256 (corrupt shard)")
    off = t["offsets"]
    samples = [SampleFeatures(t["input_ids"][a:b], t["loss_mask"][a:b], t["aux"][a:b], t["hidden"][a:b])
               for a, b in zip(off[:-1], off[1:])]
    return samples, t["sample_index"]


# ------------------------------------------------------------------------------------ manifest + reader

def write_manifest(out_dir: str, manifest: dict) -> str:
    return write_json_atomic(os.path.join(out_dir, MANIFEST), manifest)


def invalidate_manifest(out_dir: str) -> None:
    """Remove the manifest before a shard is rewritten: until the run that rewrites shards writes a new
    one, the directory is incomplete (readers refuse it) rather than an old manifest over new shards."""
    try:
        os.remove(os.path.join(out_dir, MANIFEST))
    except FileNotFoundError:
        pass


def load_manifest(out_dir: str) -> dict:
    """The manifest of a complete directory; every listed shard's file header is checked against its
    entry (``open_shard``), so a directory that mixes two runs is refused naming the first bad shard."""
    path = os.path.join(out_dir, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no {MANIFEST} in {out_dir}: preprocessing did not finish (rank 0 writes it last)")
    with open(path, encoding="utf-8") as fh:
        manifest = json.load(fh)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    for entry in manifest["shards"]:
        open_shard(shard_path(out_dir, entry["id"]), entry["key"])
    return manifest


def data_hash(manifest: dict) -> str:
    """Content hash of a preprocessed dataset, from its manifest alone (shard keys and content hashes)."""
    return json_hash([[s["key"], s["content_sha256"]] for s in manifest["shards"]])


class FeatureDataset:
    """Read access for a trainer: ``len(ds)`` samples, ``ds[i]`` -> SampleFeatures (global index i).
    Every shard is checked against its manifest key when the dataset opens and again when it is read.

    Shards are read whole and one is cached at a time, so iterate in ``ds.order()`` (shard by shard)
    for speed; ``ds.shards_for(rank, world)`` gives a data-parallel split by shard.
    """

    def __init__(self, out_dir: str, verify: bool = False):
        self.out_dir, self.verify = out_dir, verify
        self.manifest = load_manifest(out_dir)
        self._where = {}
        self._keys = {entry["id"]: entry["key"] for entry in self.manifest["shards"]}
        for entry in self.manifest["shards"]:
            for pos, i in enumerate(entry["samples"]):
                self._where[i] = (entry["id"], pos)
        self._cached: tuple[int, list[SampleFeatures]] | None = None

    def __len__(self) -> int:
        return len(self._where)

    def __getitem__(self, index: int) -> SampleFeatures:
        shard_id, pos = self._where[index]
        if self._cached is None or self._cached[0] != shard_id:
            samples, _ = read_shard(shard_path(self.out_dir, shard_id), self.verify, self._keys[shard_id])
            self._cached = (shard_id, samples)
        return self._cached[1][pos]

    def order(self) -> list[int]:
        """Global indices shard by shard (the fast iteration order)."""
        return [i for entry in self.manifest["shards"] for i in entry["samples"]]

    def shards_for(self, rank: int, world: int) -> list[int]:
        return [e["id"] for e in self.manifest["shards"] if e["id"] % world == rank]
