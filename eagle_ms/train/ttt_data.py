"""Data for the draft trainer: sample sources (preprocessed shards or online teacher features), the
train / held-out split, a resumable epoch order, data-parallel slicing and fixed-shape padding.

Order (a pure function of (seed, step), so a resumed run reads exactly the batches an uninterrupted run
would, and needs no saved RNG state): training samples are consumed epoch after epoch; epoch e is

    shards in the order permutation_{[seed, e]}, each shard's training samples in the order
    permutation_{[seed, e, shard]}

(default_rng streams), i.e. shuffled but shard by shard, so a reader holds at most two shards. The
global batch of step s is positions [s*B, (s+1)*B) of that stream; rank r of W takes the contiguous
slice [r*B/W, (r+1)*B/W). Example: B=4, W=2, step 3 -> global positions 12..15, rank 1 gets 14, 15.

Online mode groups the samples as ``eagle-ms preprocess`` would with its default layout (64 samples per
shard, 8 shard groups), so with that layout online and offline training read the same batches.

Padding: a local batch of longest length n is zero-padded to the smallest bucket >= n (one compiled
graph per bucket); padded positions have loss_mask 0, ids 0, features 0 and come after the real ones.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from eagle_ms.train import shards as sh


@dataclass(frozen=True)
class Batch:
    """One local batch, padded to ``T`` = a length bucket."""

    input_ids: np.ndarray  # [B, T] int32
    loss_mask: np.ndarray  # [B, T] float32 (0 on padding)
    aux: np.ndarray  # [B, T, 3Ht] float32
    hidden: np.ndarray  # [B, T, Ht] float32 (teacher final-norm hidden state)
    tokens: int  # real tokens in the batch
    loss_tokens: int  # loss_mask ones


class ShardSource:
    """Preprocessed features (``eagle-ms preprocess`` output). ``get(i)`` by global sample index. Every
    shard must carry its manifest key (checked on open and on each read: ``shards.open_shard``)."""

    def __init__(self, features_dir: str, cache_shards: int = 2):
        self.dir = features_dir
        self.manifest = sh.load_manifest(features_dir)
        self.groups = {e["id"]: list(e["samples"]) for e in self.manifest["shards"]}
        self.keys = {e["id"]: e["key"] for e in self.manifest["shards"]}
        self._where = {i: (sid, pos) for sid, members in self.groups.items() for pos, i in enumerate(members)}
        self._cache: OrderedDict[int, list[sh.SampleFeatures]] = OrderedDict()
        self._cache_shards = cache_shards

    @property
    def max_len(self) -> int:
        return int(self.manifest["max_len"])

    def __len__(self) -> int:
        return len(self._where)

    def get(self, index: int, max_len: int) -> sh.SampleFeatures:
        sid, pos = self._where[index]
        if sid not in self._cache:
            self._cache[sid] = sh.read_shard(sh.shard_path(self.dir, sid), key=self.keys[sid])[0]
            while len(self._cache) > self._cache_shards:
                self._cache.popitem(last=False)
        self._cache.move_to_end(sid)
        s = self._cache[sid][pos]
        if s.input_ids.size <= max_len:
            return s  # causal teacher: a cut sample's features are the prefix of the full sample's
        return sh.SampleFeatures(s.input_ids[:max_len], s.loss_mask[:max_len], s.aux[:max_len],
                                 s.hidden[:max_len])


class OnlineSource:
    """Regenerated samples whose teacher features are computed when a batch needs them (no storage).

    ``samples``: ``preprocess.load_samples`` output; ``extractor``: ``preprocess.FeatureExtractor``.
    """

    def __init__(self, samples, extractor, shard_size: int = 64, shard_groups: int = 8):
        self.samples, self.extractor = samples, extractor
        self.groups = {spec.id: list(spec.samples) for spec in sh.shard_plan(len(samples), shard_size, shard_groups)}

    @property
    def max_len(self) -> int:
        return self.extractor.max_len

    def __len__(self) -> int:
        return len(self.samples)

    def get(self, index: int, max_len: int) -> sh.SampleFeatures:
        s = self.samples[index]
        return self.extractor.extract(s.input_ids[:max_len], s.loss_mask[:max_len])


def split_heldout(groups: dict[int, list[int]], holdout_every: int, eval_samples: int):
    """(train groups {shard: [i]}, held-out indices): sample i is held out when i % holdout_every ==
    holdout_every - 1 (0 = no held-out set), at most ``eval_samples`` of them (the first ones)."""
    held = []
    if holdout_every > 0:
        held = sorted(i for members in groups.values() for i in members
                      if i % holdout_every == holdout_every - 1)[:max(eval_samples, 0)]
    out = set(held)
    train = {sid: [i for i in members if i not in out] for sid, members in groups.items()}
    return {sid: m for sid, m in train.items() if m}, held


class EpochOrder:
    """The global training stream (module doc): ``indices(start, count)`` -> sample indices."""

    def __init__(self, train_groups: dict[int, list[int]], seed: int):
        self.groups, self.seed = train_groups, seed
        self.size = sum(len(m) for m in train_groups.values())
        if self.size == 0:
            raise ValueError("no training sample (everything went to the held-out set?)")
        self._epochs: dict[int, np.ndarray] = {}

    def epoch(self, e: int) -> np.ndarray:
        if e not in self._epochs:
            sids = sorted(self.groups)
            order = np.random.default_rng([self.seed, e]).permutation(len(sids))
            parts = []
            for k in order:
                members = np.asarray(self.groups[sids[k]], np.int64)
                parts.append(members[np.random.default_rng([self.seed, e, sids[k]]).permutation(members.size)])
            self._epochs = {e: np.concatenate(parts)}  # keep one epoch in memory
        return self._epochs[e]

    def indices(self, start: int, count: int) -> list[int]:
        out = []
        for p in range(start, start + count):
            out.append(int(self.epoch(p // self.size)[p % self.size]))
        return out


def rank_slice(global_batch: int, rank: int, world: int) -> slice:
    if global_batch % world:
        raise ValueError(f"batch size {global_batch} must be divisible by the number of workers {world}")
    n = global_batch // world
    return slice(rank * n, (rank + 1) * n)


def resolve_buckets(buckets, max_len: int, min_bucket: int) -> tuple[int, ...]:
    """The padded lengths used: ``buckets`` cut at max_len, always ending with max_len; None -> doubling from
    min_bucket (``preprocess.length_buckets``). Example: (32, 128), 100 -> (32, 100)."""
    from eagle_ms.train.preprocess import length_buckets

    if not buckets:
        return length_buckets(max_len, min_bucket)
    kept = tuple(sorted({int(b) for b in buckets if 0 < int(b) < max_len}))
    return kept + (max_len,)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"sample of {n} tokens exceeds the largest length bucket {buckets[-1]}")


def make_batch(samples: list[sh.SampleFeatures], buckets: tuple[int, ...]) -> Batch:
    """Stack samples, zero-padded to the bucket of the longest one.

    ``Batch.loss_mask[t]`` is the stored mask of the token *predicted* at t: ``loss_mask[t + 1]`` (0 at
    the last position). The target at t is the teacher's distribution of token t+1, so training covers
    exactly the distributions that produce assistant tokens: the first answer token (predicted at the
    generation prompt's last token) is in, the template token after an answer's eos is out.
    Example: stored mask [0, 0, 1, 1, 0] -> batch mask [0, 1, 1, 0, 0].
    """
    t = bucket_for(max(s.input_ids.size for s in samples), buckets)
    b, h3, h = len(samples), samples[0].aux.shape[-1], samples[0].hidden.shape[-1]
    ids = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.float32)
    aux = np.zeros((b, t, h3), np.float32)
    hidden = np.zeros((b, t, h), np.float32)
    for r, s in enumerate(samples):
        n = s.input_ids.size
        ids[r, :n], mask[r, :n - 1] = s.input_ids, s.loss_mask[1:n]
        aux[r, :n], hidden[r, :n] = s.aux, s.hidden
    return Batch(ids, mask, aux, hidden, int(sum(s.input_ids.size for s in samples)), int(mask.sum()))
