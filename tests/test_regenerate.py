"""Teacher regeneration: token composition, batched decoding == batch-1 generate, resumable JSONL output;
one writer per output file, no output left by a run over unreadable data, a full disk named.

The second implementation for decoding is ``eagle_ms.generate.generate`` on a batch-1 TeacherRunner
(the loop `eagle-ms generate` uses), with the same weights and KV capacity.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from helpers_locks import held_elsewhere
from eagle_ms.locks import OutputInUseError
from eagle_ms.config import ModelConfig, SamplingParams, config_from_dict
from eagle_ms.generate import DecodeSettings, generate
from eagle_ms.models.pangu import PanguForCausalLM
from eagle_ms.teacher import TeacherRunner
from eagle_ms.tokenizer import Tokenizer, get_template
from eagle_ms.train.data import Conversation
from eagle_ms.train.jsonl import JsonlAppender, open_resumable
from eagle_ms.train.regen_batch import BatchDecoder
from eagle_ms.train.regenerate import (ChatComposer, ConversationSession, RegenOptions, plan_conversation,
                                       run_regenerate)
from eagle_ms.weights import load_state, random_teacher_state

TOKENIZER = os.path.join(REPO, "eagle_ms", "assets", "demo", "tokenizer.model")
EOS = 4  # [unused10] in the demo tokenizer
CAPACITY, CHUNK, BATCH = 96, 16, 3
MODEL = ModelConfig(vocab_size=8000, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, eos_token_id=EOS)


@pytest.fixture(scope="module")
def tok():
    return Tokenizer(TOKENIZER)


@pytest.fixture(scope="module")
def composer(tok):
    return ChatComposer(tok, get_template("openpangu"))


def _model(batch):
    model = PanguForCausalLM(MODEL, batch, CAPACITY, "eager")
    load_state(model, random_teacher_state(MODEL, seed=7, std=0.3))
    return model


@pytest.fixture(scope="module")
def models():
    return {"batched": _model(BATCH), "single": _model(1)}


def _conv(i, turns):
    msgs = []
    for t, text in enumerate(turns):
        msgs += [{"role": "user", "content": text}, {"role": "assistant", "content": f"dataset answer {i}.{t}"}]
    return Conversation(id=f"c{i}", messages=tuple(msgs))


# ------------------------------------------------------------------------------ composition (no model)

def test_plan_conversation_drops_assistant_turns_and_finds_answer_points():
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "y"}, {"role": "system", "content": "z"}]
    context, points = plan_conversation(msgs, get_template("openpangu"))
    assert context == [("system", ""), ("user", "a"), ("user", "b"), ("user", "c")]
    assert points == [1, 3]
    assert plan_conversation([{"role": "assistant", "content": "x"}], get_template("generic")) == ([], [])


def test_composed_ids_equal_encode_chat_for_text_answers(tok, composer):
    """Answers given as encode(text) + [eos] must compose to exactly encode_chat of the full chat."""
    conv = _conv(0, ["你好，介绍一下你自己", "second question?", "third"])
    answers = ["我是助手。", "an answer with   spaces", "x"]
    session = ConversationSession(conv, 0, composer, max_context=10_000)
    for text in answers:
        prompt = session.next_prompt()
        assert prompt is not None and prompt[-3:].tolist() == composer.generation_prompt
        session.add_answer(tok.encode(text) + [EOS], "eos")
    assert session.next_prompt() is None
    rec = session.record()
    msgs = [m for pair in zip([{"role": "user", "content": m["content"]} for m in conv.messages[::2]],
                              [{"role": "assistant", "content": a} for a in answers]) for m in pair]
    ref = get_template("openpangu").encode_chat(tok, msgs, False)
    assert rec["ids"] == ref.ids
    assert rec["assistant_mask"] == [int(m) for m in ref.assistant_mask]
    assert [m["content"] for m in rec["messages"] if m["role"] == "assistant"] == answers
    for turn in rec["turns"]:  # each turn's prompt is a prefix of ids; its answer follows it verbatim
        p, a = turn["prompt_len"], turn["answer_ids"]
        assert rec["ids"][p:p + len(a)] == a and all(rec["assistant_mask"][p:p + len(a)])
    assert rec["conversations"][1] == {"from": "gpt", "value": answers[0]}


def test_turn_that_does_not_fit_truncates_the_conversation(composer):
    conv = _conv(1, ["short", "a much longer second question " * 20])
    session = ConversationSession(conv, 3, composer, max_context=60)
    assert session.next_prompt() is not None
    session.add_answer([7, 8, EOS], "eos")
    assert session.next_prompt() is None
    rec = session.record()
    assert rec["status"] == "truncated" and "turn 1" in rec["reason"] and len(rec["turns"]) == 1
    too_long = ConversationSession(_conv(2, ["x " * 100]), 0, composer, max_context=60)
    assert too_long.next_prompt() is None and too_long.record()["status"] == "skipped"


def test_max_turns_and_max_prompt_tokens_limit_the_work(composer):
    conv = _conv(3, ["first question", "second question", "third question"])
    two = ConversationSession(conv, 0, composer, max_context=10_000, max_turns=2)
    for _ in range(2):
        assert two.next_prompt() is not None
        two.add_answer([7, EOS], "eos")
    assert two.next_prompt() is None
    rec = two.record()
    assert rec["status"] == "ok" and len(rec["turns"]) == 2
    assert [m["role"] for m in rec["messages"]] == ["user", "assistant", "user", "assistant"]
    first_len = len(ConversationSession(conv, 0, composer, max_context=10_000).next_prompt())
    capped = ConversationSession(conv, 0, composer, max_context=10_000, max_prompt_tokens=first_len + 3)
    assert capped.next_prompt() is not None  # turn 0 fits the cap
    capped.add_answer([7, EOS], "eos")
    assert capped.next_prompt() is None  # turn 1's prompt (turn 0 + answer + question) does not
    rec = capped.record()
    assert rec["status"] == "truncated" and "max_prompt_tokens" in rec["reason"]
    with pytest.raises(ValueError, match="max_turns"):
        RegenOptions(out="x.jsonl", max_turns=0)


# ------------------------------------------------------------------------------ resumable JSONL

def test_jsonl_partial_last_line_is_cut_and_complete_records_kept(tmp_path):
    path = str(tmp_path / "out.jsonl")
    with JsonlAppender(path) as out:
        out.append({"id": "a"})
        out.append({"id": "b"})
    with open(path, "ab") as fh:
        fh.write(b'{"id": "c", "ids": [1, 2')  # killed mid-write
    state = open_resumable(path)
    assert [r["id"] for r in state.records] == ["a", "b"] and state.repaired_bytes == len(b'{"id": "c", "ids": [1, 2')
    assert open(path, "rb").read().endswith(b'"b"}\n')
    with open(path, "ab") as fh:
        fh.write(b'{"id": "d"}')  # complete record that lost only its newline: kept
    assert [r["id"] for r in open_resumable(path).records] == ["a", "b", "d"]
    with open(path, "ab") as fh:
        fh.write(b'not json\n{"id": "e"}\n')
    with pytest.raises(ValueError, match="line 4 is not valid JSON"):
        open_resumable(path)


# ------------------------------------------------------------------------------ decoding (tiny teacher)

class _Fixed:
    """A one-turn session with a given prompt (for decoder-level tests)."""

    def __init__(self, prompt, sample_seed=None):
        self.prompt, self.sample_seed, self.answer, self.stop = prompt, sample_seed, None, None

    def next_prompt(self):
        return None if self.answer is not None else self.prompt

    def add_answer(self, tokens, stop):
        self.answer, self.stop = list(tokens), stop


def _prompts():
    rng = np.random.default_rng(5)
    lengths = [5, 40, 17, 1, 33, 16, 9]  # 1..3 prefill chunks of 16, more prompts than rows
    return [rng.integers(5, 8000, n).astype(np.int32) for n in lengths]


def _batch1_generate(model, prompt, max_new, sampling=SamplingParams()):
    runner = TeacherRunner(model, CHUNK, 2)
    return generate(runner, prompt, DecodeSettings(max_new_tokens=max_new, eos_token_id=EOS, sampling=sampling))


@pytest.mark.parametrize("refill_min", [1, 2, 3])
def test_batched_greedy_equals_batch1_generate(models, refill_min):
    prompts, max_new = _prompts(), 12
    sessions = [_Fixed(p) for p in prompts]
    finished = []
    decoder = BatchDecoder(models["batched"], CHUNK, max_new, {EOS}, refill_min=refill_min)
    stats = decoder.run(iter(sessions), finished.append)
    assert finished and len(finished) == len(prompts)  # continuous batching: 7 prompts through 3 rows
    for s in sessions:
        ref = _batch1_generate(models["single"], s.prompt, max_new)
        assert s.answer == ref.tokens, f"prompt of {s.prompt.size} tokens"
        assert s.stop == ref.stop_reason
    assert stats.generated_tokens == sum(len(s.answer) for s in sessions)
    # fewer decode calls than tokens: rows decode together
    assert stats.decode_calls < stats.generated_tokens - len(prompts)


def test_grouped_refills_need_fewer_prefill_calls(models):
    probe = [_Fixed(p) for p in _prompts()]
    BatchDecoder(models["batched"], CHUNK, 12, set()).run(iter(probe), lambda s: None)
    stops = {s.answer[k] for s, k in zip(probe, (2, 9, 5, 11, 1, 7, 4))}  # answers of varied lengths
    calls, answers = {}, {}
    for refill_min in (1, 3):
        sessions = [_Fixed(p) for p in _prompts()]
        decoder = BatchDecoder(models["batched"], CHUNK, 12, stops, refill_min=refill_min)
        calls[refill_min] = decoder.run(iter(sessions), lambda s: None).prefill_calls
        answers[refill_min] = [s.answer for s in sessions]
    assert answers[1] == answers[3] and len({len(a) for a in answers[1]}) > 2
    assert calls[3] < calls[1]
    with pytest.raises(ValueError, match="refill_min"):
        BatchDecoder(models["batched"], CHUNK, 12, set(), refill_min=4)


def test_sampled_decoding_does_not_depend_on_the_batch_and_equals_generate(models):
    """Each session samples with its own seed (positions key the draws): batched == batch-1 decoder ==
    ``generate`` with that seed, and differs from greedy."""
    prompts = _prompts()[:4]
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=0)  # seed replaced per session
    out = {}
    for name in ("batched", "single"):
        sessions = [_Fixed(p, sample_seed=300 + i) for i, p in enumerate(prompts)]
        BatchDecoder(models[name], CHUNK, 10, {EOS}, params).run(iter(sessions), lambda s: None)
        out[name] = [s.answer for s in sessions]
    assert out["batched"] == out["single"]
    for i, p in enumerate(prompts):
        sampled = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, seed=300 + i)
        assert out["batched"][i] == _batch1_generate(models["single"], p, 10, sampled).tokens
    greedy = [_batch1_generate(models["single"], p, 10).tokens for p in prompts]
    assert out["batched"] != greedy


def _write_data(path, n):
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            turns = ["hello there", "and then?"] if i % 2 else [f"question number {i} " * (1 + i % 3)]
            conv = []
            for t in turns:
                conv += [{"from": "human", "value": t}, {"from": "gpt", "value": "old answer"}]
            fh.write(json.dumps({"id": f"s{i}", "conversations": conv}, ensure_ascii=False) + "\n")


def _cfg():
    return config_from_dict({
        "model": {"model_config": {**{k: getattr(MODEL, k) for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                                     "num_hidden_layers", "num_attention_heads",
                                                                     "num_key_value_heads", "eos_token_id")}}},
        "tokenizer": {"model_file": TOKENIZER, "chat_template": "openpangu"},
        "runtime": {"seq_length": CAPACITY, "prefill_chunk": CHUNK, "batch_size": BATCH},
        "generation": {"max_new_tokens": 6}})


def _records(path):
    with open(path, encoding="utf-8") as fh:
        return {r["id"]: r for r in map(json.loads, fh)}


def test_regenerate_multi_turn_resume_and_repair(tmp_path, models):
    data = str(tmp_path / "data.jsonl")
    _write_data(data, 5)
    cfg, logs = _cfg(), []
    full = str(tmp_path / "full.jsonl")
    run_regenerate(cfg, RegenOptions(out=full, data=data), model=models["batched"], log=logs.append)
    ref = _records(full)
    assert sorted(ref) == [f"s{i}" for i in range(5)]
    two = ref["s1"]  # two turns: turn 2's context holds the teacher's own turn-1 answer
    t0, t1 = two["turns"]
    assert two["ids"][t0["prompt_len"]:t0["prompt_len"] + len(t0["answer_ids"])] == t0["answer_ids"]
    assert t1["prompt_len"] > t0["prompt_len"] + len(t0["answer_ids"])
    for turn in two["turns"]:  # each turn == batch-1 generate of that turn's prompt
        ref_turn = _batch1_generate(models["single"], np.array(two["ids"][:turn["prompt_len"]]), 6)
        assert turn["answer_ids"] == ref_turn.tokens
    # killed after 2 records, with a partial third line
    part = str(tmp_path / "part.jsonl")
    s1 = run_regenerate(cfg, RegenOptions(out=part, data=data, stop_after=2), model=models["batched"], log=logs.append)
    assert s1.written == 2
    with open(part, "ab") as fh:
        fh.write(b'{"id": "s4", "index": 4, "ids": [1, 2, 3')
    s2 = run_regenerate(cfg, RegenOptions(out=part, data=data), model=models["batched"], log=logs.append)
    assert s2.repaired_bytes > 0 and s2.skipped_done == 2 and s2.written == 3
    assert _records(part) == ref
    s3 = run_regenerate(cfg, RegenOptions(out=part, data=data), model=models["batched"], log=logs.append)
    assert (s3.written, s3.skipped_done) == (0, 5)
    with pytest.raises(ValueError, match="temperature"):
        run_regenerate(cfg.replace("generation", temperature=0.7), RegenOptions(out=part, data=data),
                       model=models["batched"])


def test_sampled_regeneration_records_its_seed_and_equals_generate(tmp_path, models):
    """Sampled regeneration (generation.temperature/top_k/top_p/seed): every conversation's seed is
    stream_seed(seed, crc32(id)), recorded; each turn's answer is ``generate`` with that seed; the
    sidecar records the sampling, so the same file cannot be resumed greedily."""
    import zlib

    from eagle_ms.sampling import stream_seed

    data, out = str(tmp_path / "data.jsonl"), str(tmp_path / "sampled.jsonl")
    _write_data(data, 3)
    cfg = _cfg().replace("generation", temperature=1.2, top_k=40, top_p=0.9, seed=11)
    run_regenerate(cfg, RegenOptions(out=out, data=data), model=models["batched"], log=lambda m: None)
    records = _records(out)
    greedy = str(tmp_path / "greedy.jsonl")
    run_regenerate(_cfg(), RegenOptions(out=greedy, data=data), model=models["batched"], log=lambda m: None)
    assert [r["turns"] for r in records.values()] != [r["turns"] for r in _records(greedy).values()]
    assert all(r["sample_seed"] is None for r in _records(greedy).values())
    for rid, rec in records.items():
        assert rec["sample_seed"] == stream_seed(11, zlib.crc32(rid.encode()))
        for turn in rec["turns"]:
            params = SamplingParams(1.2, 40, 0.9, rec["sample_seed"])
            ref = _batch1_generate(models["single"], np.array(rec["ids"][:turn["prompt_len"]]), 6, params)
            assert turn["answer_ids"] == ref.tokens
    meta = json.load(open(out + ".meta.json"))
    assert meta["temperature"] == 1.2 and meta["seed"] == 11 and meta["sampling"]["top_p"] == 0.9
    with pytest.raises(ValueError, match="sampling"):
        run_regenerate(cfg.replace("generation", top_p=0.8), RegenOptions(out=out, data=data), model=models["batched"])


# ------------------------------------------------------------------------------ one writer, OS errors

def test_a_second_regenerate_into_the_same_file_is_refused(tmp_path, models):
    data, out = str(tmp_path / "data.jsonl"), str(tmp_path / "regen.jsonl")
    _write_data(data, 3)
    run_regenerate(_cfg(), RegenOptions(out=out, data=data, stop_after=1), model=models["batched"], log=lambda m: None)
    before = open(out, "rb").read()
    with held_elsewhere("file", out) as pid:  # a first run still writing: the second must not append
        with pytest.raises(OutputInUseError, match=rf"{out} is being written by another process \(pid {pid} "):
            run_regenerate(_cfg(), RegenOptions(out=out, data=data), model=models["batched"], log=lambda m: None)
    assert open(out, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == ["data.jsonl", "regen.jsonl", "regen.jsonl.meta.json"]


def test_unreadable_data_leaves_no_output_behind(tmp_path, models):
    (tmp_path / "a_directory").mkdir()
    (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "braces.jsonl").write_bytes(b"{\x00\xff not json\n{\x01\n")  # looks like JSONL, no record
    out_dir = tmp_path / "out"
    for name, error in (("missing.jsonl", FileNotFoundError), ("a_directory", IsADirectoryError),
                        ("binary.bin", ValueError), ("braces.jsonl", ValueError)):
        data, out = str(tmp_path / name), str(out_dir / f"{name}.regen.jsonl")
        opts = RegenOptions(out=out, data=data)
        with pytest.raises(error, match=data):  # braces.jsonl: readable, but no conversation to regenerate
            run_regenerate(_cfg(), opts, model=models["batched"], log=lambda m: None)
        assert not out_dir.exists() or os.listdir(out_dir) == [], name  # no empty output, no sidecar, no lock


_APPEND_UNTIL_FULL = """
import resource, signal, sys
from eagle_ms.train.jsonl import JsonlAppender
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit, write() then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))  # a file system that is full after 1000 bytes
with JsonlAppender(sys.argv[1]) as out:
    try:
        for i in range(100):
            out.append({"id": f"r{i}", "ids": list(range(20))})
    except OSError as exc:
        print(f"{type(exc).__name__}: {exc}")
"""


def test_a_full_file_system_is_an_error_naming_the_file_and_the_file_stays_resumable(tmp_path):
    out = str(tmp_path / "regen.jsonl")
    proc = subprocess.run([sys.executable, "-c", _APPEND_UNTIL_FULL, out], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.stdout.strip() == f"OSError: [Errno 27] File too large: '{out}'", proc.stdout + proc.stderr
    assert os.path.getsize(out) == 1000  # the last record only partly written
    state = open_resumable(out)
    assert state.repaired_bytes > 0 and [r["id"] for r in state.records] == [f"r{i}" for i in range(len(state.records))]


# ------------------------------------------------------------------------------ ranks and the merge

def _lines(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def test_finished_file_is_sorted_by_index_and_rank_shares_merge_to_the_same_bytes(tmp_path, models):
    """A one-process run ends sorted by index. Rank r of 2 answers exactly the indices i % 2 == r into its
    part file; rank 0 does not merge before rank 1's receipt (RanksMissingError names rank 1); merging
    the two parts gives the one-process file byte for byte, and removes parts and receipts."""
    from eagle_ms.train.regen_parts import RanksMissingError, merge_parts, part_path, receipt_path

    data = str(tmp_path / "data.jsonl")
    _write_data(data, 5)
    one = str(tmp_path / "one.jsonl")
    s = run_regenerate(_cfg(), RegenOptions(out=one, data=data), model=models["batched"], log=lambda m: None)
    assert s.merged == 5 and [r["index"] for r in _lines(one)] == [0, 1, 2, 3, 4]
    ref = open(one, "rb").read()

    out = str(tmp_path / "two.jsonl")
    opts = RegenOptions(out=out, data=data, wait_timeout=0.2)
    with pytest.raises(RanksMissingError, match="rank 1: no receipt") as err:
        run_regenerate(_cfg(), opts, model=models["batched"], log=lambda m: None, rank=0, world=2)
    assert err.value.missing == {1: "no receipt"} and not os.path.exists(out)
    assert [r["index"] for r in _lines(part_path(out, 0, 2))] == [0, 2, 4]
    s1 = run_regenerate(_cfg(), opts, model=models["batched"], log=lambda m: None, rank=1, world=2)
    assert (s1.written, s1.merged) == (2, None) and os.path.exists(receipt_path(part_path(out, 1, 2)))
    assert sorted(r["index"] for r in _lines(part_path(out, 1, 2))) == [1, 3]
    assert merge_parts(out) == 5
    assert open(out, "rb").read() == ref
    assert sorted(os.listdir(tmp_path)) == ["data.jsonl", "one.jsonl", "one.jsonl.meta.json", "two.jsonl",
                                            "two.jsonl.meta.json"]


def test_a_rank_resumes_its_part_and_a_one_process_rerun_finishes_leftover_parts(tmp_path, models):
    """A rank stopped midway leaves a resumable part; any later run skips the ids in every part and
    folds the parts into the output (here a one-process run after a 3-rank job that never finished)."""
    from eagle_ms.train.regen_parts import part_path

    data = str(tmp_path / "data.jsonl")
    _write_data(data, 6)
    ref = str(tmp_path / "ref.jsonl")
    run_regenerate(_cfg(), RegenOptions(out=ref, data=data), model=models["batched"], log=lambda m: None)
    out = str(tmp_path / "regen.jsonl")
    s = run_regenerate(_cfg(), RegenOptions(out=out, data=data, stop_after=1), model=models["batched"],
                       log=lambda m: None, rank=2, world=3)  # indices 2 and 5: stopped after one
    assert (s.written, s.merged) == (1, None) and len(_lines(part_path(out, 2, 3))) == 1
    s = run_regenerate(_cfg(), RegenOptions(out=out, data=data), model=models["batched"], log=lambda m: None)
    assert (s.written, s.skipped_done, s.merged) == (5, 1, 6)
    assert open(out, "rb").read() == open(ref, "rb").read()
    assert not os.path.exists(part_path(out, 2, 3))


def test_a_failed_rank_stops_rank_0_waiting(tmp_path):
    """Rank 0 stops at once when every missing rank left a failure receipt, and ignores receipts older
    than its own start (an earlier run's)."""
    import time

    from eagle_ms.train.regen_parts import RanksMissingError, part_path, wait_for_ranks, write_receipt

    out = str(tmp_path / "regen.jsonl")
    write_receipt(part_path(out, 1, 3), 1, 3, 7)  # an earlier run's receipt
    started = time.time() + 5.0
    write_receipt(part_path(out, 2, 3), 2, 3, 0, error="ValueError: bad prompt")
    with pytest.raises(RanksMissingError) as err:
        wait_for_ranks(out, 3, started, timeout=0.3, poll=0.05, log=lambda m: None)
    assert err.value.missing == {1: "no receipt", 2: "no receipt"}  # both receipts predate `started`
    t0 = time.time()
    write_receipt(part_path(out, 1, 3), 1, 3, 0, error="OSError: disk full")
    with pytest.raises(RanksMissingError, match="rank 1: failed: OSError: disk full; rank 2: failed: ValueError"):
        wait_for_ranks(out, 3, t0 - 0.5, timeout=60.0, poll=0.05, log=lambda m: None)
    assert time.time() - t0 < 30.0  # did not sit out the timeout
