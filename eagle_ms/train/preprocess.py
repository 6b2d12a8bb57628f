"""Teacher-feature preprocessing (``eagle-ms preprocess``): sharded, cached, distributed with msrun.

Per sample the teacher runs one cache-free forward (``PanguForCausalLM.hidden_states`` with a causal
mask, batch 1) and the sample is stored as ``shards.SampleFeatures``: input ids, loss mask, the three
aux hidden states and the final-norm hidden state, features in fp16 (or bf16). The trainer gets the
teacher's target distribution as ``softmax(hidden @ lm_head.T)`` with the frozen teacher head: H numbers
per token instead of V. Bytes per token: ``4 + 1 + 2 * 4H`` (ids, mask, aux 3H + hidden H).

Fixed shapes: a sample of T tokens (truncated to ``max_len``) is zero-padded to the smallest length
bucket >= T (default: 64, 128, ... doubling, capped by ``max_len``), so a run compiles one graph per
bucket used; padding sits after the real tokens and the mask is causal, so real rows never see it. A
sample's numbers depend only on the sample (one per call), so any rank layout gives identical bytes.

Online mode: ``FeatureExtractor.extract`` is the same code path; a trainer can call it per batch instead
of reading shards (no storage; one teacher forward per sample per epoch).

Distribution (see ``shards`` for the layout): rank r of W takes shards ``s % W == r`` (samples
``i % W == r``). Rank and world come from ``RANK_ID`` / ``RANK_SIZE``, which msrun exports; the msrun
scheduler process (``MS_ROLE=MS_SCHED``) has nothing to do. No collective communication: ranks meet
through the file system. Each rank holds its lock on the output directory for the whole run
(``locks.lock_dir``): a second writer of a rank, or a rank of another job, is refused. Cache: a shard
whose file exists with the expected key is reused; files appear by rename, so a killed rank leaves only
``*.tmp<pid>`` files (removed by its next run) and never a file that looks complete. A rank removes
``manifest.json`` before it rewrites its first shard, so an interrupted rerun never leaves an old
manifest over mixed shards. Rank 0, after its own shards, waits (``wait_timeout`` seconds, polling)
until every shard file exists with its key, then writes ``manifest.json``; on timeout, or as soon as
every rank owning a missing shard has written a failure receipt, it raises ``MissingShardsError``
naming each missing shard and its rank.

Test hook: ``EAGLE_MS_PREPROCESS_FAIL_AFTER=RANK:COUNT[:CODE]`` makes rank RANK exit with CODE
(default 17) right after writing COUNT shards, as a killed worker would.
"""
from __future__ import annotations

import glob
import json
import os
import time
from dataclasses import dataclass

import numpy as np
from mindspore import Tensor

from eagle_ms.files import write_json_atomic
from eagle_ms.locks import lock_dir
from eagle_ms.token_ids import check_token_ids
from eagle_ms.models.training import TeacherFeatureNet
from eagle_ms.train import shards as sh
from eagle_ms.train.hashing import array_hash, json_hash, teacher_fingerprint, tokenizer_fingerprint
from eagle_ms.train.jsonl import read_unique_records

ENV_FAIL_AFTER = "EAGLE_MS_PREPROCESS_FAIL_AFTER"
REPORT_DIR = "reports"


@dataclass(frozen=True)
class PreprocessOptions:
    data: str  # regenerated JSONL (ids + assistant_mask), or ShareGPT JSON/JSONL rendered with the template
    out: str
    shard_size: int = 64  # samples per shard
    max_len: int | None = None  # None -> runtime.seq_length
    shard_groups: int | None = None  # None -> 8 if the world size divides 8, else the world size
    buckets: tuple[int, ...] | None = None  # None -> doubling from min_bucket, capped by max_len
    min_bucket: int = 64
    feature_dtype: str = "float16"
    wait_timeout: float = 600.0  # rank 0's bounded wait for the other ranks' shards (seconds)
    poll_s: float = 0.5


@dataclass(frozen=True)
class Sample:
    index: int  # global sample index
    record_id: str
    input_ids: np.ndarray  # [T] int32, T <= max_len
    loss_mask: np.ndarray  # [T] bool
    content_hash: str


class MissingShardsError(RuntimeError):
    """Rank 0 gave up waiting: ``missing`` maps shard id -> the rank that owns it."""

    def __init__(self, message: str, missing: dict[int, int]):
        super().__init__(message)
        self.missing = missing


# ------------------------------------------------------------------------------------ samples

def length_buckets(max_len: int, min_bucket: int = 64) -> tuple[int, ...]:
    """Doubling lengths from min_bucket, the last one capped at max_len. Example: (100, 32) -> (32, 64, 100)."""
    if max_len < 1 or min_bucket < 1:
        raise ValueError(f"max_len {max_len} and min_bucket {min_bucket} must be >= 1")
    out, b = [], min_bucket
    while b < max_len:
        out.append(b)
        b *= 2
    return tuple(out) + (max_len,)


def load_samples(path: str, max_len: int, render=None, log=print) -> tuple[list[Sample], dict]:
    """Samples in a fixed global order + counts of dropped records.

    Records with ``ids`` + ``assistant_mask`` (``eagle-ms regenerate`` output) are used as they are;
    other records are ShareGPT conversations rendered by ``render(messages) -> ChatEncoding``. Order:
    by the records' ``index`` field when every record has one (regeneration writes in completion
    order), else file order. Samples are cut to ``max_len``; one with no loss token left is dropped.
    One record per id (``jsonl.read_unique_records``): an identical repeat is dropped, a different one
    with the same id raises ValueError naming the id and the file.
    """
    from eagle_ms.train.data import to_conversation

    records = read_unique_records(path, log)
    if records and all(isinstance(r.get("index"), int) for r in records):
        records.sort(key=lambda r: r["index"])
    samples, dropped = [], {"no_ids": 0, "no_loss_tokens": 0, "truncated": 0}
    for n, rec in enumerate(records):
        if "ids" in rec:
            ids, mask = rec["ids"], rec.get("assistant_mask") or []
        else:
            conv, reason = to_conversation(rec, n)
            if conv is None or render is None:
                dropped["no_ids"] += 1
                continue
            enc = render(conv.messages)
            ids, mask, rec = enc.ids, enc.assistant_mask, {"id": conv.id}
        if not ids or len(ids) != len(mask):
            dropped["no_ids"] += 1
            continue
        dropped["truncated"] += len(ids) > max_len
        ids = np.asarray(ids[:max_len], dtype=np.int32)
        mask = np.asarray(mask[:max_len], dtype=bool)
        if not mask.any():
            dropped["no_loss_tokens"] += 1
            continue
        samples.append(Sample(len(samples), str(rec.get("id", n)), ids, mask, array_hash(ids, mask)))
    return samples, dropped


# ------------------------------------------------------------------------------------ teacher features

def worker_context(cfg) -> None:
    """MindSpore context of one worker: like ``runtime.setup_context``, with msrun's ``DEVICE_ID`` on devices."""
    import mindspore as ms

    device_id = int(os.environ.get("DEVICE_ID", "0")) if cfg.runtime.device_target != "CPU" else None
    ms.set_device(cfg.runtime.device_target, device_id)
    ms.set_context(mode=ms.GRAPH_MODE if cfg.runtime.exec_mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(cfg.runtime.seed)
    np.random.seed(cfg.runtime.seed)


class FeatureExtractor:
    """Teacher features of one sample (preprocessing AND the online mode: the same code path)."""

    def __init__(self, teacher, buckets: tuple[int, ...], feature_dtype: str = "float16", backend: str = "eager"):
        if feature_dtype not in sh.FEATURE_DTYPES:
            raise ValueError(f"feature_dtype {feature_dtype!r} must be one of {sh.FEATURE_DTYPES}")
        self.teacher, self.net = teacher, TeacherFeatureNet(teacher)
        self.buckets, self.feature_dtype, self.backend = tuple(sorted(buckets)), feature_dtype, backend
        self._inputs: dict[int, tuple] = {}

    @classmethod
    def from_config(cls, cfg, max_len: int | None = None, buckets=None, min_bucket: int = 64,
                    feature_dtype: str = "float16") -> "FeatureExtractor":
        from eagle_ms.models.attention import choose_backend
        from eagle_ms.runtime import build_teacher, decode_mode

        backend = choose_backend(decode_mode(cfg), cfg.runtime.device_target)
        max_len = max_len or cfg.runtime.seq_length
        teacher = build_teacher(cfg.model, cfg.checkpoint, 1, 1, backend, seed=cfg.runtime.seed)
        return cls(teacher, tuple(buckets) if buckets else length_buckets(max_len, min_bucket), feature_dtype, backend)

    @property
    def max_len(self) -> int:
        return self.buckets[-1]

    def _bucket_inputs(self, t: int):
        size = next((b for b in self.buckets if b >= t), None)
        if size is None:
            raise ValueError(f"sample of {t} tokens is longer than the largest length bucket {self.max_len}")
        if size not in self._inputs:
            pos = Tensor(np.arange(size, dtype=np.int32)[None])
            mask = Tensor(np.tril(np.ones((size, size), dtype=bool))[None])
            self._inputs[size] = (size, pos, mask)
        return self._inputs[size]

    def extract(self, input_ids, loss_mask) -> sh.SampleFeatures:
        """input_ids [T], loss_mask [T] -> SampleFeatures (T <= max_len). The online mode."""
        ids = np.asarray(input_ids, dtype=np.int32)
        size, pos, mask = self._bucket_inputs(ids.size)
        padded = np.zeros((1, size), np.int32)
        padded[0, :ids.size] = ids
        hidden, aux = self.net(Tensor(padded), pos, mask)
        t = ids.size
        return sh.SampleFeatures(ids, np.asarray(loss_mask, dtype=bool),
                                 sh.to_feature_dtype(aux.asnumpy()[0, :t].astype(np.float32), self.feature_dtype),
                                 sh.to_feature_dtype(hidden.asnumpy()[0, :t].astype(np.float32), self.feature_dtype))


# ------------------------------------------------------------------------------------ distribution

@dataclass(frozen=True)
class DistEnv:
    role: str  # "worker" | "scheduler"
    rank: int
    world: int


def distributed_env(rank: int | None = None, world: int | None = None, environ=None) -> DistEnv:
    """Rank/world from arguments, else msrun's ``RANK_ID``/``RANK_SIZE`` (``MS_ROLE=MS_SCHED``: scheduler)."""
    env = os.environ if environ is None else environ
    role = "scheduler" if env.get("MS_ROLE") == "MS_SCHED" else "worker"
    world = world if world is not None else int(env.get("RANK_SIZE", "1"))
    if rank is None:
        if world > 1 and "RANK_ID" not in env:
            raise ValueError(f"RANK_SIZE={world} but RANK_ID is not set: launch with msrun --node_rank (or pass --rank)")
        rank = int(env.get("RANK_ID", "0"))
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside [0, world size {world})")
    return DistEnv(role, rank, world)


def resolve_groups(groups: int | None, world: int) -> int:
    groups = groups if groups is not None else (8 if 8 % world == 0 else world)
    if groups % world:
        raise ValueError(f"shard_groups {groups} must be a multiple of the world size {world} "
                         "(keep it fixed across reruns so shards are reused)")
    return groups


def _fail_hook(rank: int, written: int) -> None:
    spec = os.environ.get(ENV_FAIL_AFTER)
    if not spec:
        return
    parts = [int(p) for p in spec.split(":")]
    if parts[0] == rank and written >= parts[1]:
        os._exit(parts[2] if len(parts) > 2 else 17)


# ------------------------------------------------------------------------------------ the run

def fingerprint(cfg, opts: PreprocessOptions, extractor: FeatureExtractor) -> dict:
    memo = os.path.join(opts.out, ".hash-memo.json")
    return {"format": sh.FORMAT, "teacher": teacher_fingerprint(cfg, extractor.backend, memo),
            **tokenizer_fingerprint(cfg, memo), "aux_layer_ids": list(cfg.model.aux_layer_ids),
            "max_len": extractor.max_len, "buckets": list(extractor.buckets), "feature_dtype": extractor.feature_dtype}


def _render_fn(cfg):
    from eagle_ms.runtime import load_tokenizer

    tokenizer, template = load_tokenizer(cfg)
    if tokenizer is None:
        return None
    return lambda messages: template.encode_chat(tokenizer, list(messages), False)


def run_preprocess(cfg, opts: PreprocessOptions, rank: int = 0, world: int = 1, extractor=None, log=print) -> dict:
    """Process this rank's shards; rank 0 then waits for all shards and writes the manifest.

    The rank holds its lock on ``opts.out`` throughout (eagle_ms/locks.py): a second writer of this rank
    or a rank of another job gets ``OutputInUseError`` before it touches the directory.
    """
    from eagle_ms.bench.distributed import job_id

    started = time.time()
    with lock_dir(opts.out, rank, world, job_id()):
        os.makedirs(os.path.join(opts.out, sh.SHARD_DIR), exist_ok=True)
        failed_receipt = os.path.join(opts.out, REPORT_DIR, f"rank-{rank}.failed.json")
        if os.path.exists(failed_receipt):
            os.remove(failed_receipt)
        try:
            return _run(cfg, opts, rank, world, extractor, log, started)
        except MissingShardsError:
            raise
        except Exception as exc:  # leave a receipt so rank 0 stops waiting for this rank's shards
            write_json_atomic(failed_receipt, {"rank": rank, "error": f"{type(exc).__name__}: {exc}"})
            raise


def _check_sample_ids(samples: list[Sample], vocab_size: int, data: str) -> None:
    """Every sample's ids through eagle_ms/token_ids.py before any reaches the teacher's embedding gather.

    Example: record 'a' holding 9000 at position 3 with vocab 8000 -> "data.jsonl: record 'a': token at
    position 3 is 9000: outside the model vocabulary [0, 8000): another tokenizer?".
    """
    for sample in samples:
        try:
            check_token_ids(sample.input_ids, vocab_size, f"{data}: record {sample.record_id!r}:")
        except ValueError as exc:
            raise ValueError(f"{exc}: another tokenizer?") from None


def _run(cfg, opts, rank, world, extractor, log, started) -> dict:
    groups = resolve_groups(opts.shard_groups, world)
    max_len = opts.max_len or cfg.runtime.seq_length
    if extractor is None:
        extractor = FeatureExtractor.from_config(cfg, max_len, opts.buckets, opts.min_bucket, opts.feature_dtype)
    if extractor.max_len != max_len:
        raise ValueError(f"extractor buckets end at {extractor.max_len}, but max_len is {max_len}")
    samples, dropped = load_samples(opts.data, max_len, _render_fn(cfg), log)
    if not samples:
        raise ValueError(f"{opts.data}: no usable sample (dropped: {dropped})")
    _check_sample_ids(samples, cfg.model.vocab_size, opts.data)
    fp = fingerprint(cfg, opts, extractor)
    base = json_hash(fp)
    plan = sh.shard_plan(len(samples), opts.shard_size, groups)
    keys = {s.id: sh.shard_key(base, [(i, samples[i].record_id, samples[i].content_hash) for i in s.samples])
            for s in plan}
    mine = [s for s in plan if s.id % world == rank]
    computed, reused = [], []
    for spec in mine:
        path = sh.shard_path(opts.out, spec.id)
        for stale in glob.glob(path + ".tmp*"):  # a killed earlier run of this rank
            os.remove(stale)
        meta = sh.shard_metadata(path)
        if meta is not None and meta.get("key") == keys[spec.id]:
            reused.append(spec.id)
            continue
        if not computed:  # from now on the directory mixes runs until rank 0 writes the new manifest
            sh.invalidate_manifest(opts.out)
        feats = [extractor.extract(samples[i].input_ids, samples[i].loss_mask) for i in spec.samples]
        sh.write_shard(opts.out, spec, keys[spec.id], [samples[i].record_id for i in spec.samples], feats,
                       extractor.feature_dtype)
        computed.append(spec.id)
        log(f"[preprocess rank {rank}/{world}] shard {spec.id}: {len(spec.samples)} samples "
            f"({len(computed)} computed, {len(reused)} reused of {len(mine)})")
        _fail_hook(rank, len(computed))
    report = {"rank": rank, "world": world, "computed": computed, "reused": reused,
              "seconds": time.time() - started}
    write_json_atomic(os.path.join(opts.out, REPORT_DIR, f"rank-{rank}.json"), report)
    log(f"[preprocess rank {rank}/{world}] done: {len(computed)} shards computed, {len(reused)} reused")
    if rank != 0:
        return {"report": report}
    owners = {s.id: s.id % world for s in plan}
    wait_for_shards(opts.out, keys, owners, opts.wait_timeout, opts.poll_s, started, log)
    manifest = build_manifest(cfg, opts, fp, base, plan, groups, dropped, len(samples))
    sh.write_manifest(opts.out, manifest)
    log(f"[preprocess] manifest: {len(plan)} shards, {manifest['totals']['tokens']} tokens, "
        f"{manifest['bytes_per_token']['total']} bytes/token -> {os.path.join(opts.out, sh.MANIFEST)}")
    return {"report": report, "manifest": manifest}


def wait_for_shards(out: str, keys: dict[int, str], owners: dict[int, int], timeout: float, poll: float,
                    started: float, log=print) -> None:
    """Block until every shard file exists with its key; raise MissingShardsError after ``timeout`` s,
    or earlier when every rank owning a missing shard left a failure receipt during this run."""
    deadline, pending = time.time() + timeout, dict(keys)
    while True:
        for sid in list(pending):
            meta = sh.shard_metadata(sh.shard_path(out, sid))
            if meta is not None and meta.get("key") == pending[sid]:
                del pending[sid]
        if not pending:
            return
        failed = _failed_ranks(out, started)
        waiting_on = {owners[s] for s in pending}
        if time.time() >= deadline or waiting_on <= set(failed):
            missing = {s: owners[s] for s in sorted(pending)}
            by_rank = {r: [s for s, o in missing.items() if o == r] for r in sorted(waiting_on)}
            why = "; ".join(f"rank {r}: shards {ids}" + (f" (rank failed: {failed[r]})" if r in failed else "")
                            for r, ids in by_rank.items())
            raise MissingShardsError(f"{len(missing)} of {len(keys)} shards are missing after "
                                     f"{time.time() - started:.0f} s -- {why}. Rerun the same command: "
                                     "complete shards are reused.", missing)
        time.sleep(poll)


def _failed_ranks(out: str, started: float) -> dict[int, str]:
    failed = {}
    for path in glob.glob(os.path.join(out, REPORT_DIR, "rank-*.failed.json")):
        if os.path.getmtime(path) + 1.0 < started:  # a receipt from an earlier run
            continue
        try:
            with open(path, encoding="utf-8") as fh:
                rec = json.load(fh)
            failed[int(rec["rank"])] = rec["error"]
        except (OSError, ValueError, KeyError):
            continue
    return failed


def build_manifest(cfg, opts, fp, base, plan, groups, dropped, num_samples) -> dict:
    entries = [sh.shard_entry(sh.shard_path(opts.out, s.id)) for s in plan]
    h = cfg.model.hidden_size
    per_token = {"input_ids": 4, "loss_mask": 1, "aux": 2 * 3 * h, "hidden": 2 * h}
    per_token["total"] = sum(per_token.values())
    return {"format": sh.FORMAT, "fingerprint": fp, "base_key": base, "data": os.path.abspath(opts.data),
            "num_samples": num_samples, "dropped": dropped, "shard_size": opts.shard_size, "shard_groups": groups,
            "max_len": fp["max_len"], "buckets": fp["buckets"], "feature_dtype": fp["feature_dtype"],
            "hidden_size": h, "aux_layer_ids": fp["aux_layer_ids"], "vocab_size": cfg.model.vocab_size,
            "bytes_per_token": per_token,
            "totals": {"tokens": sum(e["tokens"] for e in entries),
                       "loss_tokens": sum(e["loss_tokens"] for e in entries),
                       "bytes": sum(e["bytes"] for e in entries)},
            "shards": entries}
