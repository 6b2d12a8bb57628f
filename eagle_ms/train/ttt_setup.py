"""Setup of a draft-training run: the data source, the frozen teacher tensors, the draft and its vocabulary.

Checks (errors name the offending value): features from another teacher (architecture or weights in
the manifest's fingerprint) are refused; the vocabulary must be for the teacher's vocabulary size; a
warm-start draft (``--init``) must fit the teacher and carry exactly the vocabulary's d2t/t2d (no silent
remap: rebuild the vocabulary with ``build-vocab --attach DRAFT`` instead).
"""
from __future__ import annotations

import json
import os

import numpy as np

from eagle_ms.train import ttt_data as td


def open_source(cfg, tc, log):
    """(source, extractor or None): preprocessed shards (``tc.data``) or online features (``tc.online``)."""
    if tc.data is not None:
        source = td.ShardSource(tc.data)
        check_features_teacher(cfg, source.manifest, tc.data, tc.work_dir)
        log(f"[train-draft] {len(source)} preprocessed samples in {tc.data} (max_len {source.max_len})")
        return source, None
    from eagle_ms.train.preprocess import FeatureExtractor, _render_fn, load_samples

    max_len = tc.max_len or cfg.runtime.seq_length
    extractor = FeatureExtractor.from_config(cfg, max_len, td.resolve_buckets(tc.buckets, max_len, tc.min_bucket))
    samples, dropped = load_samples(tc.online, max_len, _render_fn(cfg), log)
    if not samples:
        raise ValueError(f"{tc.online}: no usable sample (dropped: {dropped})")
    bad = next((s for s in samples if s.input_ids.max() >= cfg.model.vocab_size), None)
    if bad is not None:
        raise ValueError(f"{tc.online}: record {bad.record_id!r} has token id {int(bad.input_ids.max())} outside "
                         f"the teacher vocabulary [0, {cfg.model.vocab_size})")
    log(f"[train-draft] online mode: {len(samples)} samples from {tc.online} (dropped: {dropped})")
    return td.OnlineSource(samples, extractor), extractor


def check_features_teacher(cfg, manifest: dict, path: str, work_dir: str) -> None:
    """Refuse features computed by another teacher (architecture, weights, aux layers, sizes)."""
    from eagle_ms.train.hashing import teacher_fingerprint

    os.makedirs(work_dir, exist_ok=True)
    ours = json.loads(json.dumps(teacher_fingerprint(cfg, "eager", os.path.join(work_dir, ".hash-memo.json")),
                                 default=list))
    theirs = manifest.get("fingerprint", {}).get("teacher", {})
    diffs = [k for k in ("model", "weights") if theirs.get(k) != ours[k]]
    if manifest.get("hidden_size") != cfg.model.hidden_size or manifest.get("vocab_size") != cfg.model.vocab_size:
        diffs.append("hidden_size/vocab_size")
    if list(manifest.get("aux_layer_ids", [])) != list(cfg.model.aux_layer_ids):
        diffs.append("aux_layer_ids")
    if diffs:
        raise ValueError(f"features in {path} were computed by another teacher than the configured one "
                         f"({', '.join(diffs)} differ): use the config (and --set overrides) of the preprocessing run")


def teacher_tensors(cfg, extractor=None) -> tuple[np.ndarray, np.ndarray]:
    """(embedding [V, H], lm_head [V, H]) float32 of the configured teacher (tied head -> the embedding)."""
    from eagle_ms.weights import model_state, open_checkpoint, random_teacher_state

    if extractor is not None:
        state = model_state(extractor.teacher)
        embed = state["model.embed_tokens.weight"]
        return embed, state.get("lm_head.weight", embed)
    if cfg.checkpoint is None:
        state = random_teacher_state(cfg.model, cfg.runtime.seed)  # what build_teacher uses
        embed = state["model.embed_tokens.weight"]
        return embed, state.get("lm_head.weight", embed)
    entries = open_checkpoint(cfg.checkpoint)
    embed = entries["model.embed_tokens.weight"].read().astype(np.float32)
    head = entries["lm_head.weight"].read().astype(np.float32) if "lm_head.weight" in entries else embed
    return embed, head


def load_run_vocab(cfg, tc):
    """The draft vocabulary of the run (DraftVocab) and where it came from."""
    from eagle_ms.train.vocab import DraftVocab, load_vocab

    v = cfg.model.vocab_size
    if tc.vocab is None:
        return DraftVocab(np.zeros(v, np.int64), np.ones(v, bool)), "full teacher vocabulary"
    vocab, _, _ = load_vocab(tc.vocab)
    if vocab.t2d.size != v:
        raise ValueError(f"vocabulary {tc.vocab} is for {vocab.t2d.size} target ids, the teacher has {v}")
    return vocab, tc.vocab


def build_draft(cfg, tc, embed: np.ndarray, log):
    """(Eagle3Draft with weights, its Eagle3Config, DraftVocab): seeded init or ``--init`` warm start."""
    from eagle_ms.draft_weights import default_draft_config, load_draft_checkpoint, load_draft_state, random_draft_state
    from eagle_ms.models.eagle3 import Eagle3Draft
    from eagle_ms.train.vocab import DraftVocab

    vocab, where = load_run_vocab(cfg, tc)
    if tc.init is not None:
        dcfg, state = load_draft_checkpoint(tc.init, cfg.model)
        theirs = DraftVocab(state["d2t"].astype(np.int64), state["t2d"].astype(bool))
        if tc.vocab is None:
            vocab, where = theirs, tc.init
        elif not theirs.equals(vocab):
            raise ValueError(f"--init draft {tc.init} has another draft vocabulary than {tc.vocab}: refusing a silent "
                             f"remap (make the vocabulary with `eagle-ms build-vocab --attach {tc.init}`)")
        log(f"[train-draft] warm start from {tc.init}")
    else:
        dcfg = default_draft_config(cfg.model, int(vocab.d2t.size))
        state = random_draft_state(dcfg, tc.seed, used_tokens=vocab.used)
    draft = Eagle3Draft(dcfg, 1, 1, 1, "eager", "float32")
    draft.set_train(True)
    load_draft_state(draft, state, embed=embed)
    log(f"[train-draft] draft: hidden {dcfg.hidden_size}, {dcfg.num_attention_heads} heads, "
        f"vocab {dcfg.draft_vocab_size}/{dcfg.vocab_size} ({where}), aux layers {list(dcfg.aux_layer_ids)}")
    return draft, dcfg, vocab
