"""Causal-LM training of a Pangu-architecture teacher from scratch, or continued from an existing HF-layout
checkpoint (``init_from``: the demo teacher on 2 048-token windows; eagle_ms/assets/demo/MODEL_CARD.md).

Data: chat conversations rendered with the teacher's chat template (``encode_chat``), concatenated
into one token stream (packing); every ``holdout_every``-th conversation goes to a held-out stream.
Batches are random windows of ``seq_len + 1`` tokens drawn with ``default_rng([seed, step])``, so a
resumed run sees exactly the batches an uninterrupted run would. Checkpoints (weights, AdamW moments,
step, history) are written atomically every ``save_every`` steps; ``train`` resumes from the newest.
One trainer per work directory (``locks.lock_dir``).
A work dir without a checkpoint starts from ``init_from`` (strict load, fresh optimiser) when given,
else from the seeded init; a checkpoint, when present, always wins.

Held-out loss by position band (``band_losses``): mean next-token cross entropy of the first ``windows``
consecutive held-out windows, split by the position of the predicting token in its window
(``[0, band)``, ``[band, 2 band)``, ...): shows whether a model degrades past the context it was trained on.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from mindspore import Tensor

from eagle_ms.config import ModelConfig
from eagle_ms.files import atomic_write
from eagle_ms.locks import lock_dir
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.models.training import CausalLMLoss, CausalLMTokenLoss, TrainStep
from eagle_ms.train.checkpoint import latest_step, load_train_state, save_train_state
from eagle_ms.train.optim import OptimConfig, lr_schedule, make_optimizer, trainable


@dataclass(frozen=True)
class LMTrainConfig:
    work_dir: str
    seq_len: int = 512
    batch_size: int = 8
    steps: int = 10000  # length of the lr schedule
    stop_after: int | None = None  # checkpoint and return after this step (a later run with other steps resumes)
    eval_every: int = 500  # 0: no held-out evals in this process (each eval graph holds its own host memory)
    eval_windows: int = 64
    save_every: int = 200
    log_every: int = 20
    holdout_every: int = 50
    seed: int = 0
    init_from: str | None = None  # HF-layout checkpoint to start from when work_dir has no checkpoint yet
    eval_band: int = 0  # > 0: evals also log held-out loss by position band of this width (band_losses)
    optim: OptimConfig = field(default_factory=OptimConfig)


def token_streams(conversations, tokenizer, template, holdout_every: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, heldout) uint16 token streams: each conversation's chat ids, concatenated."""
    train, held = [], []
    for i, conv in enumerate(conversations):
        ids = template.encode_chat(tokenizer, conv.messages, False).ids
        (held if i % holdout_every == holdout_every - 1 else train).append(np.asarray(ids, dtype=np.uint16))
    return np.concatenate(train), np.concatenate(held)


def cached_token_streams(conversations_fn, tokenizer, template, holdout_every: int, cache_dir: str,
                         data_key: str) -> tuple[np.ndarray, np.ndarray]:
    """``token_streams`` cached on disk under a hash of (tokenizer file, template, data key, split)."""
    h = hashlib.sha256()
    with open(tokenizer.path, "rb") as fh:
        h.update(fh.read())
    h.update(json.dumps(template.to_dict(), sort_keys=True, ensure_ascii=False).encode())
    h.update(f"{data_key}|{holdout_every}".encode())
    path = os.path.join(cache_dir, f"lm-tokens-{h.hexdigest()[:16]}.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            return z["train"], z["heldout"]
    train, held = token_streams(conversations_fn(), tokenizer, template, holdout_every)
    atomic_write(path, lambda fh: np.savez(fh, train=train, heldout=held), binary=True)
    return train, held


def sample_batch(stream: np.ndarray, batch: int, seq_len: int, seed: int, step: int) -> tuple[np.ndarray, ...]:
    """Random windows: (input_ids [B,T], labels [B,T]) int32, a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, stream.size - seq_len - 1, batch)
    windows = np.stack([stream[s:s + seq_len + 1] for s in starts]).astype(np.int32)
    return windows[:, :-1], windows[:, 1:]


def evaluate(loss_net: CausalLMLoss, stream: np.ndarray, batch: int, seq_len: int, windows: int) -> float:
    """Mean loss over the first ``windows`` consecutive held-out windows (fixed, comparable across runs)."""
    count = min(windows, (stream.size - 1) // seq_len)
    losses = []
    for start in range(0, count - batch + 1, batch):
        w = np.stack([stream[(start + j) * seq_len:(start + j) * seq_len + seq_len + 1] for j in range(batch)])
        w = w.astype(np.int32)
        losses.append(float(loss_net(Tensor(w[:, :-1]), Tensor(w[:, 1:])).asnumpy()))
    return float(np.mean(losses))


def heldout_windows(stream: np.ndarray, seq_len: int, windows: int) -> np.ndarray:
    """The first ``windows`` consecutive windows [n, seq_len + 1] int32 of ``stream`` (as ``evaluate``)."""
    count = min(windows, (stream.size - 1) // seq_len)
    if count < 1:
        raise ValueError(f"stream of {stream.size} tokens holds no window of {seq_len} + 1 tokens")
    return np.stack([stream[j * seq_len:j * seq_len + seq_len + 1] for j in range(count)]).astype(np.int32)


def band_losses(token_loss: CausalLMTokenLoss, stream: np.ndarray, seq_len: int, windows: int, band: int,
                batch: int = 1) -> dict:
    """Held-out loss by position band over the first ``windows`` windows of ``seq_len`` (+1) tokens.

    Position p of a window is the token that predicts token p + 1 (it sees p + 1 tokens of context).
    Returns {"windows", "seq_len", "band", "tokens_per_band", "mean", "bands": [{"start", "end", "loss",
    "ppl"}]} with ``end`` exclusive; ``mean`` is over all positions. ``token_loss`` must be built for
    ``seq_len``; ``batch`` must divide the number of windows used (a shorter last batch would compile a
    second graph), so the windows used are rounded down to a multiple of ``batch``.
    """
    if seq_len % band:
        raise ValueError(f"seq_len {seq_len} is not a multiple of band {band}")
    w = heldout_windows(stream, seq_len, windows)
    w = w[:w.shape[0] // batch * batch]
    if not w.shape[0]:
        raise ValueError(f"fewer than batch={batch} windows of {seq_len} tokens")
    per_token = np.concatenate([token_loss(Tensor(w[i:i + batch, :-1]), Tensor(w[i:i + batch, 1:])).asnumpy()
                                for i in range(0, w.shape[0], batch)]).astype(np.float64)  # [n, T]
    bands = []
    for start in range(0, seq_len, band):
        loss = float(per_token[:, start:start + band].mean())
        bands.append({"start": start, "end": start + band, "loss": loss, "ppl": float(np.exp(loss))})
    return {"windows": int(w.shape[0]), "seq_len": seq_len, "band": band, "tokens_per_band": int(w.shape[0] * band),
            "mean": float(per_token.mean()), "bands": bands}


def format_bands(result: dict) -> str:
    """One-line summary of ``band_losses``: 'bands 0-511 4.78 | 512-1023 4.70 | ...'."""
    return "bands " + " | ".join(f"{b['start']}-{b['end'] - 1} {b['loss']:.4f}" for b in result["bands"])


def init_from_checkpoint(teacher: PanguForCausalLM, model_cfg: ModelConfig, path: str) -> None:
    """Strictly load an HF-layout teacher checkpoint (any float dtype -> the parameters' dtype)."""
    from eagle_ms.weights import check_checkpoint_config, load_teacher_checkpoint

    check_checkpoint_config(model_cfg, path)
    load_teacher_checkpoint(teacher, path)


def train_lm(model_cfg: ModelConfig, cfg: LMTrainConfig, train_stream: np.ndarray, held_stream: np.ndarray,
             log=print) -> PanguForCausalLM:
    """Train (or resume) and return the teacher. Progress lines go to ``log``.

    The work directory is locked for the whole run (``locks.lock_dir``): a second trainer into it is
    refused with ``OutputInUseError`` naming the holder instead of interleaving checkpoints.
    """
    with lock_dir(cfg.work_dir):
        return _train_lm(model_cfg, cfg, train_stream, held_stream, log)


def _train_lm(model_cfg: ModelConfig, cfg: LMTrainConfig, train_stream: np.ndarray, held_stream: np.ndarray,
              log) -> PanguForCausalLM:
    teacher = PanguForCausalLM(model_cfg, 1, 1, "eager")
    _init_weights(teacher, model_cfg, cfg.seed)
    ckpt_dir = os.path.join(cfg.work_dir, "checkpoints")
    if cfg.init_from is not None and latest_step(ckpt_dir) is None:
        init_from_checkpoint(teacher, model_cfg, cfg.init_from)
        log(f"[init] weights from {cfg.init_from} (fresh optimiser state)")
    loss_net = CausalLMLoss(teacher, cfg.seq_len)
    token_loss = CausalLMTokenLoss(teacher, cfg.seq_len) if cfg.eval_band > 0 else None
    optimizer = make_optimizer(trainable(teacher), cfg.optim)
    step_cell = TrainStep(loss_net, optimizer, cfg.optim.grad_clip)
    start, history = 0, {"train": [], "eval": []}
    if latest_step(ckpt_dir) is not None:
        start, history = load_train_state(ckpt_dir, optimizer, log)
        log(f"[resume] from step {start}")
    tokens_per_step = cfg.batch_size * cfg.seq_len
    lrs = lr_schedule(cfg.optim)
    t_last, last_step = time.perf_counter(), start
    end = cfg.steps if cfg.stop_after is None else min(cfg.steps, cfg.stop_after)
    for step in range(start, end):
        ids, labels = sample_batch(train_stream, cfg.batch_size, cfg.seq_len, cfg.seed, step)
        loss = float(step_cell(Tensor(ids), Tensor(labels)).asnumpy())
        if not np.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}; last checkpoint is kept in {ckpt_dir}")
        history["train"].append([step + 1, loss])
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            now = time.perf_counter()
            rate = (done - last_step) * tokens_per_step / max(now - t_last, 1e-9)
            eta_h = (cfg.steps - done) * tokens_per_step / max(rate, 1e-9) / 3600
            log(f"step {done}/{cfg.steps} loss {loss:.4f} lr {lrs[step]:.2e} "
                f"{rate:.0f} tok/s ETA {eta_h:.2f} h")
            t_last, last_step = now, done
        if cfg.eval_every > 0 and (done % cfg.eval_every == 0 or done == cfg.steps):
            if token_loss is None:
                held = evaluate(loss_net, held_stream, cfg.batch_size, cfg.seq_len, cfg.eval_windows)
                history["eval"].append([done, held])
                log(f"eval step {done}: held-out loss {held:.4f} ppl {np.exp(held):.2f}")
            else:
                res = band_losses(token_loss, held_stream, cfg.seq_len, cfg.eval_windows, cfg.eval_band)
                held = res["mean"]
                history["eval"].append([done, held, [b["loss"] for b in res["bands"]]])
                log(f"eval step {done}: held-out loss {held:.4f} ppl {np.exp(held):.2f} {format_bands(res)}")
        if done % cfg.save_every == 0 or done == end:
            save_train_state(ckpt_dir, optimizer, done, history, {"config": asdict(cfg)})
    return teacher


def _init_weights(teacher: PanguForCausalLM, model_cfg: ModelConfig, seed: int) -> None:
    """GPT-2 style init: N(0, 0.02), output projections scaled by 1/sqrt(2 * layers); norms 1; biases 0."""
    from eagle_ms.models.param_layout import checkpoint_slots
    from eagle_ms.weights import load_state

    rng = np.random.default_rng(seed)
    state = {}
    scale_out = 0.02 / np.sqrt(2 * model_cfg.num_hidden_layers)
    for key, slot in checkpoint_slots(teacher).items():  # HF keys and shapes, in parameter order
        if len(slot.shape) == 1:
            state[key] = (np.ones if "norm" in key else np.zeros)(slot.shape, np.float32)
        else:
            std = scale_out if key.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
            state[key] = rng.normal(0.0, std, slot.shape).astype(np.float32)
    load_state(teacher, state, source=f"init(seed={seed})")
