"""Question files -> turns: the shared 240-turn data, limits, sharding, and errors naming file:line."""
import json
import os

import pytest
from conftest import SHARED_DATA

from eagle_ms.bench.datasets import (DatasetError, expand_turns, load_questions, parse_datasets,
                                     read_question_file, shard_turns)


def _write(tmp_path, name, lines):
    folder = tmp_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "question.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(folder / "question.jsonl")


def _q(qid, turns=("hi",), **extra):
    return json.dumps({"question_id": qid, "category": "c", "turns": list(turns), **extra})


@pytest.mark.skipif(not os.path.isdir(SHARED_DATA), reason="shared data not present")
def test_shared_data_gives_240_turns():
    questions = load_questions(SHARED_DATA)
    turns = expand_turns(questions)
    assert len(questions) == 160 and len(turns) == 240
    assert [t.key for t in turns[:3]] == ["mt_bench-81-1", "mt_bench-81-2", "mt_bench-82-1"]
    assert turns[-1].key == "humaneval-79-1" and [t.index for t in turns] == list(range(240))
    shards = [shard_turns(turns, r, 8) for r in range(8)]
    assert sum(len(s) for s in shards) == 240
    for r, s in enumerate(shards):  # both turns of a question on one rank; indices kept
        assert all(t.question_id % 8 == r for t in s)
    limited = expand_turns(load_questions(SHARED_DATA, "mt_bench,humaneval", limit=2))
    assert [t.key for t in limited] == ["mt_bench-81-1", "mt_bench-81-2", "mt_bench-82-1", "mt_bench-82-2",
                                        "humaneval-0-1", "humaneval-1-1"]


@pytest.mark.parametrize("line, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"category": "c", "turns": ["x"]}), "'question_id' must be an integer"),
    (json.dumps({"question_id": True, "turns": ["x"]}), "'question_id' must be an integer"),
    (json.dumps({"question_id": -1, "turns": ["x"]}), ">= 0"),
    (json.dumps({"question_id": 3, "turns": []}), "non-empty list of strings"),
    (json.dumps({"question_id": 3, "turns": ["a", 5]}), "non-empty list of strings"),
    (json.dumps({"question_id": 3, "category": 7, "turns": ["a"]}), "'category' must be a string"),
    (json.dumps({"question_id": 3, "turns": ["a"], "reference": "x"}), "'reference'"),
    (_q(0), "duplicate question_id 0 \\(first on line 1\\)"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    path = _write(tmp_path, "ds", [_q(0), "", line])  # blank line 2 is skipped; the bad one is line 3
    with pytest.raises(DatasetError, match=f"{path}:3: .*{message}"):
        read_question_file(path, "ds")


def test_missing_files_and_bad_arguments(tmp_path):
    _write(tmp_path, "a", [_q(5, ("t1", "t2")), _q(6)])
    with pytest.raises(DatasetError, match="question file not found: .*nope/question.jsonl"):
        load_questions(str(tmp_path), "a,nope")
    with pytest.raises(DatasetError, match="--limit"):
        load_questions(str(tmp_path), "a", limit=0)
    with pytest.raises(DatasetError, match="not a directory"):
        load_questions(str(tmp_path / "missing"), "a")
    with pytest.raises(DatasetError, match="twice"):
        parse_datasets("a,a")
    with pytest.raises(DatasetError, match="no dataset names"):
        parse_datasets(" , ")
    turns = expand_turns(load_questions(str(tmp_path), "a", limit=1))
    assert [(t.key, t.turn, t.index) for t in turns] == [("a-5-1", 1, 0), ("a-5-2", 2, 1)]
    with pytest.raises(ValueError, match="rank 2"):
        shard_turns(turns, 2, 2)


def test_binary_question_file_is_named(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "question.jsonl").write_bytes(_q(0).encode() + b"\n\x89PNG\r\n\x1a\n\xff\x00\x81")
    with pytest.raises(DatasetError, match=r"bin/question.jsonl:2: not UTF-8 text"):
        read_question_file(str(folder / "question.jsonl"), "bin")
