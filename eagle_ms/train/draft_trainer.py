"""EAGLE-3 draft training with training-time test (``eagle-ms train-draft``; docs/training.md).

Pieces: ``ttt`` (the unrolled draft, loss and eval Cells), ``ttt_data`` (sources, order, batches),
``ttt_metrics`` (held-out acceptance), ``optim`` (AdamW + warmup/cosine + clipping), ``checkpoint``
(atomic resumable checkpoints). Per step, for the local batch:

    teacher targets graph: hidden [b,T,Ht] -> P restricted to the draft vocabulary, mask m, argmax
                           (per micro-batch of b = --micro-batch samples)
    host:                  per-step loss-position counts of the whole batch (all-reduced over ranks)
    grad graph:            TTT loss -> grads, per micro-batch, summed into Parameters in place
    apply graph:           (those sums) all-reduce mean (msrun) -> clip -> AdamW, once per step

Micro-batches change the memory, not the step: every micro-batch's loss divides by the counts of the
whole global batch, so the summed loss and gradients are those of the whole batch (up to float order).
The unrolled TTT graph keeps every step's [b, H, T, T] attention scores for the backward, so its memory grows
with b x T^2: at T = 1 280 a batch of 4 in one graph does not fit in 24 GB (docs/training.md).

Frozen: the teacher's token embedding (a non-trainable copy inside the draft) and lm_head (targets
only). Trained: fc, midlayer.*, norm, lm_head of the draft. Every rank starts from the same seeded
weights and applies the same averaged gradients, so W workers == 1 worker with the same global batch.

Resume: the newest ``<work_dir>/checkpoints/step-N`` holds the optimizer Cell (draft weights, AdamW
moments, step counter) and state.json (step, history, the run identity). The data order is a pure
function of (seed, step) and no other randomness is used, so the resumed run continues exactly.
"""
from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from mindspore import Tensor, nn

from eagle_ms.files import check_can_create, write_json_atomic
from eagle_ms.locks import lock_dir
from eagle_ms.train import ttt_data as td
from eagle_ms.train.checkpoint import latest_step, load_train_state, save_train_state
from eagle_ms.models.training import AccumulateGrads, ApplyGrads, ApplySums
from eagle_ms.models.ttt import AllReduceSum, TeacherTargets, TTTDraft, TTTEval, TTTLoss, step_counts
from eagle_ms.train.optim import OptimConfig, lr_schedule, make_optimizer, trainable
from eagle_ms.train.ttt_metrics import FIELDS, band_counts, batch_counts, summarize, summarize_bands

EXPORT_DTYPES = ("float32", "float16", "bfloat16")
# fields that define the run: a resume with any of them changed is refused
IDENTITY = ("data", "online", "vocab", "init", "batch_size", "max_len", "ttt_steps", "decay", "ttt_mask",
            "holdout_every", "eval_samples", "seed")


def draft_optim(**overrides) -> OptimConfig:
    """The EAGLE-3 recipe's optimiser defaults (AdamW 0.9/0.95, no weight decay, clip 0.5)."""
    base = dict(lr=1e-4, min_lr_ratio=0.1, warmup_steps=100, total_steps=1000, weight_decay=0.0, beta1=0.9,
                beta2=0.95, grad_clip=0.5)
    base.update(overrides)
    return OptimConfig(**base)


@dataclass(frozen=True)
class DraftTrainConfig:
    out: str | None  # exported EAGLE-3 draft directory (None only with eval_only)
    work_dir: str  # checkpoints/, summary.json
    data: str | None = None  # preprocessed features directory ...
    online: str | None = None  # ... or a regenerated JSONL (teacher features computed per batch)
    vocab: str | None = None  # build-vocab file (d2t/t2d); None = the full teacher vocabulary
    init: str | None = None  # warm start from an EAGLE-3 draft (its d2t/t2d must equal the vocab's)
    steps: int = 1000
    stop_after: int | None = None  # stop (and checkpoint) after this step: time-boxed jobs, tests
    batch_size: int = 8  # global batch (split over the workers)
    micro_batch: int | None = None  # samples per graph call (divides the local batch); None = the local batch
    max_len: int | None = None  # None: the features' max_len (online: runtime.seq_length)
    buckets: tuple[int, ...] | None = None  # None: doubling from min_bucket up to max_len
    min_bucket: int = 64
    ttt_steps: int = 7
    decay: float = 0.8
    ttt_mask: str = "inference"  # "inference" | "eagle" (see eagle_ms.train.ttt)
    eval_every: int = 200  # 0 = only at the end
    eval_samples: int = 64
    eval_band: int = 256  # held-out acceptance is also reported per answer-offset band of this width
    eval_only: bool = False  # evaluate the --init draft on the held-out set and stop (no training)
    holdout_every: int = 50  # sample i is held out when i % holdout_every == holdout_every - 1; 0 = none
    save_every: int = 200
    log_every: int = 10
    seed: int = 0  # draft init + data order
    export_dtype: str = "float32"
    optim: OptimConfig = field(default_factory=draft_optim)

    def __post_init__(self):
        if (self.data is None) == (self.online is None):
            raise ValueError("give exactly one of --data FEATURES_DIR and --online REGEN.jsonl")
        if self.eval_only and self.init is None:
            raise ValueError("eval_only evaluates the --init draft: give --init DRAFT")
        if not self.eval_only and not self.out:
            raise ValueError("give --out DRAFT_DIR (where the trained draft is exported)")
        for name in ("steps", "batch_size", "ttt_steps", "log_every", "save_every", "eval_band"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)!r}: must be >= 1")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ValueError(f"micro_batch = {self.micro_batch!r}: must be >= 1")
        if self.export_dtype not in EXPORT_DTYPES:
            raise ValueError(f"export dtype {self.export_dtype!r}: must be one of {EXPORT_DTYPES}")
        if not 0 < self.decay <= 1:
            raise ValueError(f"decay = {self.decay!r}: must be in (0, 1]")
        for name in ("eval_every", "holdout_every", "eval_samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} = {getattr(self, name)!r}: must be >= 0")
        if self.stop_after is not None and self.stop_after < 1:
            raise ValueError(f"stop_after = {self.stop_after!r}: must be >= 1")
        if self.ttt_mask not in ("inference", "eagle"):
            raise ValueError(f"ttt_mask = {self.ttt_mask!r}: must be 'inference' or 'eagle'")

    def identity(self) -> dict:
        d = asdict(self)
        return {k: d[k] for k in IDENTITY}


class DraftTraining:
    """Everything a run needs, built from an EagleMsConfig (the teacher) + DraftTrainConfig."""

    def __init__(self, cfg, tc: DraftTrainConfig, rank: int = 0, world: int = 1, log=print):
        from eagle_ms.train.ttt_setup import build_draft, open_source, teacher_tensors

        self.cfg, self.tc, self.rank, self.world = cfg, tc, rank, world
        self.log = log if rank == 0 else (lambda *_: None)
        self.source, extractor = open_source(cfg, tc, self.log)
        share = td.rank_slice(tc.batch_size, rank, world)  # the global batch must split evenly
        local = share.stop - share.start
        self.micro = tc.micro_batch or local
        if local % self.micro:
            raise ValueError(f"micro_batch {self.micro} must divide the local batch of {local} samples "
                             f"(batch size {tc.batch_size} over {world} worker(s))")
        self.max_len = min(tc.max_len or self.source.max_len, self.source.max_len)
        self.buckets = td.resolve_buckets(tc.buckets, self.max_len, tc.min_bucket)
        embed, head = teacher_tensors(cfg, extractor)
        self.draft, self.draft_cfg, self.vocab = build_draft(cfg, tc, embed, self.log)
        train_groups, self.heldout = td.split_heldout(self.source.groups, tc.holdout_every, tc.eval_samples)
        if tc.eval_only and not self.heldout:
            raise ValueError(f"eval_only: no held-out sample (holdout_every {tc.holdout_every}, eval_samples "
                             f"{tc.eval_samples}); --holdout-every 1 evaluates every sample of the data")
        self.order = None if tc.eval_only else td.EpochOrder(train_groups, tc.seed)  # eval_only may hold out all
        self.core = TTTDraft(self.draft, tc.ttt_steps, tc.ttt_mask)
        self.targets = TeacherTargets(head, self.vocab.used, self.vocab.t2d)
        self.optimizer = make_optimizer(trainable(self.draft), tc.optim)
        reducer = None
        if world > 1:
            reducer = nn.DistributedGradReducer(self.optimizer.parameters, mean=True, degree=world)
        self.grad_cell = AccumulateGrads(TTTLoss(self.core, tc.decay, world), self.optimizer.parameters)
        self.apply_cell = ApplySums(self.grad_cell.sums, ApplyGrads(self.optimizer, tc.optim.grad_clip, reducer))
        self.first = (Tensor(True), Tensor(False))  # AccumulateGrads: start the sum, or add to it
        self.evaluator = TTTEval(self.core)
        self.reduce_cell = AllReduceSum() if world > 1 else None
        self.ckpt_dir = os.path.join(tc.work_dir, "checkpoints")

    # ------------------------------------------------------------------ pieces

    def allreduce(self, x: np.ndarray) -> np.ndarray:
        """Sum over ranks (identity for one worker). Every rank must call it at the same points."""
        if self.reduce_cell is None:
            return np.asarray(x, np.float64)
        return self.reduce_cell(Tensor(np.asarray(x, np.float32))).asnumpy().astype(np.float64)

    def local_batches(self, step: int) -> list[td.Batch]:
        """This rank's share of step ``step``'s global batch, as micro-batches (each padded to its own bucket)."""
        b = self.tc.batch_size
        mine = self.order.indices(step * b, b)[td.rank_slice(b, self.rank, self.world)]
        samples = [self.source.get(i, self.max_len) for i in mine]
        return [td.make_batch(samples[k:k + self.micro], self.buckets) for k in range(0, len(samples), self.micro)]

    def train_step(self, micro_batches: list[td.Batch]) -> float:
        """One optimiser step on the local micro-batches; returns the local loss (world * this rank's share).

        Every rank calls the counts all-reduce once per step, before its first gradient.
        """
        targets = [self.targets(Tensor(mb.hidden), Tensor(mb.loss_mask))[:2] for mb in micro_batches]
        counts = sum(step_counts(valid.asnumpy(), self.tc.ttt_steps) for _, valid in targets)
        counts = Tensor(np.maximum(self.allreduce(counts), 1.0).astype(np.float32))  # [S] global
        loss = 0.0
        for k, (mb, (target_p, valid)) in enumerate(zip(micro_batches, targets)):
            part = self.grad_cell(self.first[k > 0], Tensor(mb.input_ids), Tensor(mb.aux), target_p, valid, counts)
            loss += float(part.asnumpy())
        self.apply_cell()
        return loss

    def compile_graphs(self, train: bool = True) -> None:
        """Compile the targets, evaluation and (``train``) gradient graphs of every length bucket now.

        Under msrun a rank that meets a new bucket mid-run compiles for tens of seconds while the others
        wait in the step's gradient all-reduce, and MindSpore's CPU collective then fails ("Ring ReduceScatter
        wait receiving ... failed": seen with 2 workers at T = 1 280). With every graph compiled before
        step 1 the ranks stay within a step of each other. ``Cell.compile`` compiles without running.
        """
        t0 = time.perf_counter()
        b, steps, dcfg = self.micro, self.tc.ttt_steps, self.draft_cfg
        h = dcfg.target_hidden_size
        vd = int(np.asarray(self.vocab.used).size)
        for t in self.buckets:
            ids, mask = Tensor(np.zeros((b, t), np.int32)), Tensor(np.zeros((b, t), np.float32))
            aux = Tensor(np.zeros((b, t, len(dcfg.aux_layer_ids) * h), np.float32))
            target_p = Tensor(np.zeros((b, t, vd), np.float32))
            self.targets.compile(Tensor(np.zeros((b, t, h), np.float32)), mask)
            self.evaluator.compile(ids, aux, target_p, mask)
            if train:
                self.grad_cell.compile(self.first[0], ids, aux, target_p, mask, Tensor(np.ones(steps, np.float32)))
        self.log(f"[train-draft] compiled the graphs of {len(self.buckets)} length buckets {list(self.buckets)} "
                 f"x micro-batch {b} in {time.perf_counter() - t0:.0f} s")

    def evaluate(self) -> dict:
        """Held-out TTT loss and acceptance (ttt_metrics), over all ranks' shares of the held-out set;
        ``bands``: the acceptance by answer-offset band of width ``eval_band``."""
        mine = self.heldout[self.rank::self.world]
        b, width, steps = self.micro, self.tc.eval_band, self.tc.ttt_steps
        n_bands = -(-self.max_len // width)
        counts = np.zeros((len(FIELDS), steps), np.float64)
        bands = np.zeros((n_bands, 4, steps), np.float64)
        for start in range(0, len(mine), b):
            batch = td.make_batch([self.source.get(i, self.max_len) for i in mine[start:start + b]], self.buckets)
            target_p, valid, argmax = self.targets(Tensor(batch.hidden), Tensor(batch.loss_mask))
            tops, sums, cnt = self.evaluator(Tensor(batch.input_ids), Tensor(batch.aux), target_p, valid)
            tops, argmax = tops.asnumpy(), argmax.asnumpy()
            counts += batch_counts(tops, argmax, batch.loss_mask, sums.asnumpy(), cnt.asnumpy())
            bands += band_counts(tops, argmax, batch.loss_mask, width, n_bands)
        total = self.allreduce(np.concatenate([counts.reshape(-1), bands.reshape(-1)]))
        counts, bands = total[:counts.size].reshape(counts.shape), total[counts.size:].reshape(bands.shape)
        return {**summarize(counts, self.tc.decay), "bands": summarize_bands(bands, width)}

    def export(self, path: str | None = None) -> str:
        from eagle_ms.draft_weights import draft_state, save_draft_checkpoint

        path = path or self.tc.out
        save_draft_checkpoint(draft_state(self.draft), self.draft_cfg, path, self.tc.export_dtype)
        return path

    # ------------------------------------------------------------------ run

    def resume(self) -> tuple[int, dict]:
        if latest_step(self.ckpt_dir) is None:
            return 0, {"train": [], "eval": []}
        step, history = load_train_state(self.ckpt_dir, self.optimizer, self.log)
        with open(os.path.join(self.ckpt_dir, f"step-{step}", "state.json"), encoding="utf-8") as fh:
            saved = json.load(fh).get("identity")
        now = json.loads(json.dumps(self.tc.identity()))
        if saved != now:
            diff = sorted(k for k in now if (saved or {}).get(k) != now[k])
            raise ValueError(f"checkpoint in {self.ckpt_dir} belongs to another run ({', '.join(diff)} differ); "
                             "use another --work-dir")
        self.log(f"[train-draft] resumed from step {step} (data position {step * self.tc.batch_size})")
        return step, history

    def save(self, step: int, history: dict) -> None:
        if self.rank == 0:
            save_train_state(self.ckpt_dir, self.optimizer, step, history,
                             {"identity": self.tc.identity(), "data_position": step * self.tc.batch_size,
                              "seed": self.tc.seed})

    def run(self) -> dict:
        """Train (or resume) to ``steps`` (or ``stop_after``); export at the end. Returns the summary.

        Each rank holds its lock on the work directory for the whole run (eagle_ms/locks.py): a second
        run into it is refused (``OutputInUseError`` naming the holder). Before step 1, rank 0 checks that
        the export directory ``out`` can be written (``files.check_can_create``), so a bad ``--out``
        fails now, not after the last step.
        """
        from eagle_ms.bench.distributed import job_id

        with lock_dir(self.tc.work_dir, self.rank, self.world, job_id()):
            if self.tc.eval_only:
                return self._evaluate_only()
            if self.rank == 0:
                check_can_create(self.tc.out)
            return self._run()

    def _evaluate_only(self) -> dict:
        """``eval_only``: the --init draft on the held-out set; W/eval.json and the returned summary."""
        self.compile_graphs(train=False)
        result = {"eval_only": True, "draft": self.tc.init, "eval": self.evaluate(), "peak_rss_gib": peak_rss_gib()}
        self.log(f"[train-draft] --init draft {self.tc.init}: {_fmt_eval(result['eval'])}")
        if self.rank == 0:
            write_json_atomic(os.path.join(self.tc.work_dir, "eval.json"), result)
        return result

    def _run(self) -> dict:
        tc = self.tc
        start, history = self.resume()
        end = min(tc.steps, tc.stop_after) if tc.stop_after is not None else tc.steps
        self.compile_graphs()
        if start == 0 and self.heldout:
            history["eval"].append([0, self.evaluate()])
            self.log(f"[train-draft] untrained draft: {_fmt_eval(history['eval'][-1][1])}")
        lrs = lr_schedule(tc.optim)
        meter = _Meter(end, self.log)
        for step in range(start, end):
            micro_batches = self.local_batches(step)
            loss = self.train_step(micro_batches)
            if not np.isfinite(loss):
                raise FloatingPointError(f"loss is {loss} at step {step + 1} on rank {self.rank}; the last "
                                         f"checkpoint is kept in {self.ckpt_dir}")
            stats = self.allreduce([loss / self.world, sum(mb.tokens for mb in micro_batches),
                                    sum(mb.loss_tokens for mb in micro_batches)])
            done = step + 1
            history["train"].append([done, float(stats[0])])
            meter.update(done, float(stats[0]), int(stats[1]), float(lrs[min(step, lrs.size - 1)]),
                         force=done == end or done % tc.log_every == 0)
            paused = time.perf_counter()
            if self.heldout and (done == tc.steps or (tc.eval_every and done % tc.eval_every == 0)):
                history["eval"].append([done, self.evaluate()])
                self.log(f"[train-draft] eval step {done}: {_fmt_eval(history['eval'][-1][1])}")
            if done % tc.save_every == 0 or done == end:
                self.save(done, history)
            meter.exclude(time.perf_counter() - paused)
        summary = {"steps_done": max(end, start), "finished": max(end, start) >= tc.steps, "rank": self.rank,
                   "world": self.world, "train_tokens_per_s": meter.rate(), "last_loss": (history["train"] or
                   [[0, None]])[-1][1], "eval": history["eval"][-1] if history["eval"] else None,
                   "untrained_eval": history["eval"][0] if history["eval"] and history["eval"][0][0] == 0 else None,
                   "peak_rss_gib": peak_rss_gib()}
        if summary["finished"] and self.rank == 0:
            summary["out"] = self.export()
            self.log(f"[train-draft] exported the draft to {summary['out']}")
        if self.rank == 0:
            write_json_atomic(os.path.join(tc.work_dir, "summary.json"), {**summary, "history": history}, indent=None)
        return summary


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (Linux ``ru_maxrss``, KiB), in GiB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)


def _fmt_eval(m: dict) -> str:
    return (f"loss {m['loss']:.4f} acc {' '.join(f'{a:.3f}' for a in m['acc'])} | chain "
            f"{' '.join(f'{a:.3f}' for a in m['cond_acc'])} | accept_len {m['accept_len']:.3f} "
            f"({m['positions']} positions)" + "".join(
                f"{' | accept_len by answer offset:' if i == 0 else ','} {b['from']}-{'' if b['to'] is None else b['to'] - 1} "
                f"{b['accept_len']:.2f}" for i, b in enumerate(m.get("bands", []))))


class _Meter:
    """Progress lines: loss, lr, real tokens/s (global), ETA. The first step (graph compile) is timed apart."""

    def __init__(self, end: int, log):
        self.end, self.log = end, log
        self.t_last = time.perf_counter()
        self.tokens = 0
        self.first = True
        self.total_tokens, self.total_time, self.steps, self.pending_steps = 0, 0.0, 0, 0

    def update(self, done: int, loss: float, tokens: int, lr: float, force: bool) -> None:
        now = time.perf_counter()
        if self.first:
            self.log(f"step {done}/{self.end} loss {loss:.4f} lr {lr:.2e} (first step incl. compile "
                     f"{now - self.t_last:.1f} s)")
            self.first, self.t_last, self.tokens = False, now, 0
            return
        self.tokens += tokens
        self.pending_steps += 1
        if not force:
            return
        dt = max(now - self.t_last, 1e-9)
        rate = self.tokens / dt
        self.total_tokens, self.total_time = self.total_tokens + self.tokens, self.total_time + dt
        self.steps += self.pending_steps
        eta = (self.end - done) * self.total_time / self.steps
        self.log(f"step {done}/{self.end} loss {loss:.4f} lr {lr:.2e} {rate:.0f} tok/s ETA {eta / 60:.1f} min")
        self.t_last, self.tokens, self.pending_steps = now, 0, 0

    def exclude(self, seconds: float) -> None:
        """Do not count time spent outside training steps (evaluation, checkpoints)."""
        self.t_last += seconds

    def rate(self) -> float | None:
        return self.total_tokens / self.total_time if self.total_time > 0 else None
