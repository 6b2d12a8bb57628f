"""The draft trainer end to end on a tiny seeded teacher (one process; the msrun run is in
test_draft_train_msrun.py).

Data made here with the pipeline itself: ShareGPT-style conversations -> ``run_regenerate`` (the teacher's
greedy answers) -> ``run_preprocess`` (features) -> ``build_vocab`` (256 draft tokens of 8000). Checks:
a few hundred TTT steps lower the loss and lift held-out acceptance far above the untrained draft's
(both evaluated by the trainer's evaluation); resume from a checkpoint == an uninterrupted run (bitwise);
online mode == offline mode (default shard layout); the exported draft loads with draft_weights and is lossless in
``eagle_ms.generate`` (and accepts tokens); runs from another teacher / vocabulary are refused; a work
directory another process writes and an export directory that cannot be written are refused before step 1.
"""
import dataclasses
import json
import os

import numpy as np
import pytest

from conftest import REPO
from helpers_locks import held_elsewhere
from eagle_ms.config import ModelConfig, config_from_dict
from eagle_ms.draft_weights import load_draft_checkpoint
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.locks import OutputInUseError
from eagle_ms.runtime import build_runner, eagle3_drafter_from_state
from eagle_ms.train.draft_trainer import DraftTrainConfig, DraftTraining, draft_optim
from eagle_ms.train.preprocess import PreprocessOptions, run_preprocess
from eagle_ms.train.regenerate import RegenOptions, run_regenerate
from eagle_ms.train.vocab import build_vocab
from eagle_ms.safetensors_format import read_safetensors
from eagle_ms.weights import random_teacher_state, save_teacher_checkpoint

TOKENIZER = os.path.join(REPO, "eagle_ms", "assets", "demo", "tokenizer.model")
MODEL = dict(vocab_size=8000, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, eos_token_id=4)
WORDS = "the cat dog runs fast slow red blue green tree house car road sky sun moon star river hill".split()
N_CONV, MAX_LEN, DRAFT_VOCAB = 40, 64, 256


def quiet(*_):
    pass


def make_config(root: str, checkpoint: str):
    return config_from_dict({
        "model": {"model_config": MODEL, "checkpoint": checkpoint},
        "tokenizer": {"model_file": TOKENIZER, "chat_template": "openpangu"},
        "runtime": {"seq_length": 96, "prefill_chunk": 32}, "generation": {"max_new_tokens": 32}})


def make_pipeline_data(root: str, n_conv: int = N_CONV, teacher_std: float = 0.1, seed: int = 0) -> dict:
    """Teacher checkpoint + regenerated JSONL + features + draft vocabulary under ``root`` (used by the msrun
    test too). Returns the paths and the config."""
    os.makedirs(root, exist_ok=True)
    model = ModelConfig(**MODEL)
    teacher = os.path.join(root, "teacher")
    save_teacher_checkpoint(random_teacher_state(model, seed, std=teacher_std), model, teacher)
    cfg = make_config(root, teacher)
    rng = np.random.default_rng(seed)
    chats = os.path.join(root, "chats.jsonl")
    with open(chats, "w", encoding="utf-8") as fh:
        for i in range(n_conv):
            text = " ".join(rng.choice(WORDS, int(rng.integers(3, 9))))
            fh.write(json.dumps({"id": f"c{i}", "conversations": [{"from": "human", "value": text}]}) + "\n")
    regen = os.path.join(root, "regen.jsonl")
    run_regenerate(cfg, RegenOptions(out=regen, data=chats, batch_size=8), log=quiet)
    features = os.path.join(root, "features")
    run_preprocess(cfg, PreprocessOptions(data=regen, out=features, max_len=MAX_LEN, min_bucket=MAX_LEN), log=quiet)
    vocab = os.path.join(root, "vocab.safetensors")
    build_vocab(features, DRAFT_VOCAB, vocab, log=quiet)
    return {"cfg": cfg, "teacher": teacher, "regen": regen, "features": features, "vocab": vocab}


def train_config(pipeline: dict, out: str, work: str, **kw) -> DraftTrainConfig:
    steps = kw.pop("steps", 8)
    base = dict(out=out, work_dir=work, data=pipeline["features"], vocab=pipeline["vocab"], steps=steps, batch_size=4,
                ttt_steps=2, holdout_every=0, eval_every=0, log_every=50, save_every=1000,
                optim=draft_optim(lr=3e-3, warmup_steps=2, total_steps=steps))
    base.update(kw)
    return DraftTrainConfig(**base)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_pipeline_data(str(tmp_path_factory.mktemp("draft_train")))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """200 steps of the default 7-step TTT, evaluated before and after on every 5th sample."""
    root = tmp_path_factory.mktemp("trained")
    steps = 200
    tc = train_config(data, str(root / "draft"), str(root / "work"), steps=steps, ttt_steps=7, holdout_every=5,
                      optim=draft_optim(lr=3e-3, warmup_steps=10, total_steps=steps))
    summary = DraftTraining(data["cfg"], tc, log=quiet).run()
    with open(root / "work" / "summary.json", encoding="utf-8") as fh:
        return summary, json.load(fh)["history"], tc


def test_training_lowers_loss_and_raises_heldout_acceptance(trained):
    summary, history, _ = trained
    assert summary["finished"] and summary["eval"][0] == 200
    before, after = summary["untrained_eval"][1], summary["eval"][1]
    losses = np.array([loss for _, loss in history["train"]])
    assert losses[-20:].mean() < losses[0] - 0.8  # 21.9 -> 20.7 here (the soft CE includes the teacher's entropy)
    assert after["loss"] < before["loss"] - 0.5
    assert len(after["acc"]) == 7 and after["positions"] == before["positions"] > 100
    assert after["acc"][0] > before["acc"][0] + 0.2  # untrained: ~1/256
    assert np.mean(after["acc"]) > np.mean(before["acc"]) + 0.15
    assert after["accept_len"] > before["accept_len"] + 0.5
    # the chain metric is the product of conditional acceptances
    assert after["accept_len"] == pytest.approx(float(np.sum(np.cumprod(after["cond_acc"]))), abs=1e-5)


def test_eval_only_of_the_exported_draft_equals_the_final_evaluation(data, trained, tmp_path):
    """--eval-only --init <exported float32 draft> == the trainer's own final evaluation, bands included."""
    summary, _, tc = trained
    final = summary["eval"][1]
    assert final["bands"] and sum(b["positions"] for b in final["bands"]) <= final["positions"]
    assert [(b["from"], b["to"]) for b in final["bands"]] == [(0, None)]  # MAX_LEN 64: one band, open-ended
    only = train_config(data, None, str(tmp_path / "w"), init=summary["out"], eval_only=True, vocab=None,
                        holdout_every=tc.holdout_every, ttt_steps=tc.ttt_steps)
    got = DraftTraining(data["cfg"], only, log=quiet).run()["eval"]
    assert got["positions"] == final["positions"]
    assert got["accept_len"] == pytest.approx(final["accept_len"], abs=1e-6)
    assert got["bands"][0]["accept_len"] == pytest.approx(final["bands"][0]["accept_len"], abs=1e-6)
    assert os.path.exists(tmp_path / "w" / "eval.json") and not os.path.exists(tmp_path / "w" / "checkpoints")
    with pytest.raises(ValueError, match="give --init DRAFT"):
        train_config(data, None, str(tmp_path / "w2"), eval_only=True)
    # a data set of held-out prompts alone (--holdout-every 1): every sample evaluated, none left to train
    every = dataclasses.replace(only, work_dir=str(tmp_path / "w3"), holdout_every=1, eval_samples=10_000)
    got_all = DraftTraining(data["cfg"], every, log=quiet).run()["eval"]
    assert got_all["positions"] > got["positions"]
    with pytest.raises(ValueError, match="eval_only: no held-out sample .*--holdout-every 1"):
        DraftTraining(data["cfg"], dataclasses.replace(only, work_dir=str(tmp_path / "w4"), holdout_every=0), log=quiet)


def test_exported_draft_loads_and_is_lossless(data, trained):
    summary, _, tc = trained
    cfg = data["cfg"]
    dcfg, state = load_draft_checkpoint(summary["out"], cfg.model)
    assert dcfg.draft_vocab_size == DRAFT_VOCAB and dcfg.aux_layer_ids == cfg.model.aux_layer_ids
    assert dcfg.target_hidden_size == cfg.model.hidden_size
    vocab = read_safetensors(data["vocab"])
    np.testing.assert_array_equal(state["d2t"], vocab["d2t"])
    np.testing.assert_array_equal(state["t2d"], vocab["t2d"])
    runner = build_runner(cfg)
    records = sorted((json.loads(line) for line in open(data["regen"], encoding="utf-8")), key=lambda r: r["index"])
    drafter = eagle3_drafter_from_state(runner, dcfg, state, budget=8, max_depth=4, top_k=2)
    taus = []
    for rec in [r for r in records if r["index"] % 5 == 4][:2]:  # held-out conversations
        prompt = np.asarray(rec["ids"][:rec["turns"][0]["prompt_len"]], np.int64)
        base = generate(runner, prompt, DecodeSettings(max_new_tokens=24))
        spec = generate(runner, prompt, DecodeSettings(budget=8, max_depth=4, max_new_tokens=24), drafter)
        assert spec.tokens == base.tokens
        taus.append(spec.tau)
    assert np.mean(taus) > 1.3, taus  # the trained draft's tokens get accepted


def _weights(path):
    return {k: v for k, v in read_safetensors(os.path.join(path, "model.safetensors")).items()}


def test_resume_continues_exactly_and_online_equals_offline(data, tmp_path):
    full = train_config(data, str(tmp_path / "full"), str(tmp_path / "w_full"))
    DraftTraining(data["cfg"], full, log=quiet).run()
    part = train_config(data, str(tmp_path / "part"), str(tmp_path / "w_part"), stop_after=3)
    first = DraftTraining(data["cfg"], part, log=quiet).run()
    assert not first["finished"] and first["steps_done"] == 3 and not os.path.exists(tmp_path / "part")
    resumed = DraftTraining(data["cfg"], train_config(data, str(tmp_path / "part"), str(tmp_path / "w_part")),
                            log=quiet)
    assert resumed.resume()[0] == 3
    resumed.run()
    online = train_config(data, str(tmp_path / "online"), str(tmp_path / "w_online"), data=None, online=data["regen"],
                          max_len=MAX_LEN, min_bucket=MAX_LEN)
    DraftTraining(data["cfg"], online, log=quiet).run()
    a, b, c = _weights(tmp_path / "full"), _weights(tmp_path / "part"), _weights(tmp_path / "online")
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"resume: {key}")
        np.testing.assert_array_equal(a[key], c[key], err_msg=f"online: {key}")
    with open(tmp_path / "w_full" / "summary.json", encoding="utf-8") as fh:
        hist_full = json.load(fh)["history"]["train"]
    with open(tmp_path / "w_part" / "summary.json", encoding="utf-8") as fh:
        hist_part = json.load(fh)["history"]["train"]
    assert hist_part == hist_full  # the history survives the restart too


def test_micro_batches_take_the_same_steps_as_the_whole_batch(data, tmp_path):
    """--micro-batch 2 (gradients summed over 2 graph calls) == the batch of 4 in one call (micro-batch 1
    is the same accumulation loop with 4 calls)."""
    runs = {}
    for micro in (None, 2):
        tc = train_config(data, str(tmp_path / f"o{micro}"), str(tmp_path / f"w{micro}"), micro_batch=micro)
        DraftTraining(data["cfg"], tc, log=quiet).run()
        with open(tmp_path / f"w{micro}" / "summary.json", encoding="utf-8") as fh:
            runs[micro] = (_weights(tmp_path / f"o{micro}"), np.array(json.load(fh)["history"]["train"]))
    whole, whole_loss = runs[None]
    weights, losses = runs[2]
    np.testing.assert_allclose(losses, whole_loss, rtol=1e-5, err_msg="micro-batch 2: losses")
    for key in whole:
        np.testing.assert_allclose(weights[key], whole[key], rtol=1e-4, atol=1e-5, err_msg=f"micro-batch 2: {key}")


def test_refusals(data, tmp_path):
    tc = train_config(data, str(tmp_path / "o"), str(tmp_path / "w"), stop_after=1)
    DraftTraining(data["cfg"], tc, log=quiet).run()
    changed = train_config(data, str(tmp_path / "o"), str(tmp_path / "w"), batch_size=2)
    with pytest.raises(ValueError, match="another run.*batch_size"):
        DraftTraining(data["cfg"], changed, log=quiet).run()
    other = make_config(str(tmp_path), None)  # seeded random weights: not the teacher of the features
    with pytest.raises(ValueError, match="another teacher"):
        DraftTraining(other, train_config(data, str(tmp_path / "o2"), str(tmp_path / "w2")), log=quiet)
    with pytest.raises(ValueError, match="exactly one of"):
        train_config(data, "o", "w", online=data["regen"])
    with pytest.raises(ValueError, match="micro_batch 3 must divide the local batch of 4 samples"):
        DraftTraining(data["cfg"], train_config(data, str(tmp_path / "o3"), str(tmp_path / "w3"), micro_batch=3),
                      log=quiet)
    with pytest.raises(ValueError, match="micro_batch = 0"):
        train_config(data, "o", "w", micro_batch=0)


def test_a_busy_work_dir_and_an_unwritable_out_are_refused_before_step_1(data, tmp_path):
    work = str(tmp_path / "w")
    with held_elsewhere("dir", work) as pid:
        with pytest.raises(OutputInUseError, match=rf"{work} is being written by another process \(pid {pid}"):
            DraftTraining(data["cfg"], train_config(data, str(tmp_path / "o"), work), log=quiet).run()
    (tmp_path / "file").write_text("not a directory")  # an export location nobody can write, root included
    out = tmp_path / "file" / "draft"
    with pytest.raises(NotADirectoryError, match=f"cannot create {out}: {tmp_path / 'file'} is not a directory"):
        DraftTraining(data["cfg"], train_config(data, str(out), work), log=quiet).run()
    assert not os.path.exists(os.path.join(work, "checkpoints"))  # refused before any step was trained
