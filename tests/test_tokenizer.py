"""Tokenizer wrapper and chat templates, on a tiny SentencePiece model trained in the test."""
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eagle_ms.tokenizer import ChatTemplate, Tokenizer, UnknownPieceError, get_template
from eagle_ms.train.tokenizer_build import (OPENPANGU_PIECES, conversation_sentences,
                                            train_sentencepiece)

SYLLABLES = ["ka", "to", "ri", "mu", "sen", "pa", "lo", "qu", "ex", "def", "的", "是", "模型"]


def _generated_conversations(n=300, seed=0):
    rng = random.Random(seed)
    convs = []
    for _ in range(n):
        words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                 for _ in range(rng.randint(3, 12))]
        text = " ".join(words) + rng.choice([".", "?", "\n", ":\n    x = 1\n"])
        convs.append([{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}])
    return convs


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("sp") / "tiny"
    built = train_sentencepiece(_generated_conversations(), prefix, vocab_size=400, num_threads=1,
                                character_coverage=1.0)
    assert built.model_path.is_file() and not prefix.with_suffix(".vocab").exists()
    return Tokenizer(built.model_path)


def test_ids_and_special_pieces(tok):
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (0, 1, 2, 0, 400)
    for expected_id, piece in enumerate(OPENPANGU_PIECES, start=3):
        assert tok.token_to_id(piece) == expected_id
        assert tok.encode(piece) == [expected_id]          # atomic in plain encode
    ids = tok.encode("ka[unused9]用户：to[unused10]")
    assert tok.token_to_id("[unused9]") in ids and tok.token_to_id("[unused10]") == ids[-1]
    assert tok.encode("[unused10][unused9]") == [4, 3]


def test_encode_has_no_bos_eos_unless_asked(tok):
    plain = tok.encode("kato rimu")
    assert tok.bos_id not in plain and tok.eos_id not in plain
    assert tok.encode("kato rimu", add_bos=True, add_eos=True) == [1, *plain, 2]
    assert tok.encode("") == []


@pytest.mark.parametrize("text", [
    "kato rimu senpa", "  leading and  double spaces ", "def f(x):\n\tif x:\n        return 1\n",
    "unseen chars: Ω ж 🙂 €", "中文的模型是", "line\r\nwindows", "：[unused9]x[unused10]"])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_round_trip_any_text(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_unknown_piece_and_bad_ids(tok):
    with pytest.raises(KeyError, match="no_such_piece"):
        tok.token_to_id("no_such_piece")
    assert issubclass(UnknownPieceError, KeyError)
    assert tok.token_to_id("<unk>") == 0
    with pytest.raises(ValueError, match="400"):
        tok.decode([5, 400])


def test_missing_and_corrupt_model_file(tmp_path):
    missing = tmp_path / "nope" / "tokenizer.model"
    with pytest.raises(FileNotFoundError, match="nope"):
        Tokenizer(missing)
    corrupt = tmp_path / "corrupt.model"
    corrupt.write_bytes(b"this is not a protobuf")
    with pytest.raises(ValueError, match="corrupt.model"):
        Tokenizer(corrupt)


OPENPANGU = get_template("openpangu")


def test_openpangu_user_only():
    msgs = [{"role": "user", "content": "你好"}]
    assert OPENPANGU.render(msgs, add_generation_prompt=False) == \
        "[unused9]系统：[unused10][unused9]用户：你好[unused10]"
    assert OPENPANGU.render(msgs, add_generation_prompt=True) == \
        "[unused9]系统：[unused10][unused9]用户：你好[unused10][unused9]助手："


MULTI = [{"role": "system", "content": "You are helpful."},
         {"role": "user", "content": "kato ri?"},
         {"role": "assistant", "content": "mu senpa."},
         {"role": "user", "content": "and lo"}]


def test_openpangu_multi_turn_with_generation_prompt():
    assert OPENPANGU.render(MULTI, add_generation_prompt=True) == (
        "[unused9]系统：You are helpful.[unused10]"
        "[unused9]用户：kato ri?[unused10]"
        "[unused9]助手：mu senpa.[unused10]"
        "[unused9]用户：and lo[unused10]"
        "[unused9]助手：")


def test_openpangu_tool_and_function_roles():
    msgs = [{"role": "tool", "content": "a"}, {"role": "function", "content": "b"}]
    assert OPENPANGU.render(msgs, False) == \
        "[unused9]系统：[unused10][unused9]工具：a[unused10][unused9]方法：b[unused10]"


def _masked_runs(ids, mask):
    runs, current = [], []
    for i, m in zip(ids, mask):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def test_encode_chat_ids_and_assistant_mask(tok):
    convo = MULTI[:3] + [{"role": "user", "content": "ka"}, {"role": "assistant", "content": "exdef 的"}]
    ids, mask = OPENPANGU.encode_chat(tok, convo, add_generation_prompt=False)
    assert ids == [tok.bos_id] + tok.encode(OPENPANGU.render(convo, False))
    assert len(mask) == len(ids) and mask[0] is False
    runs = _masked_runs(ids, mask)
    assert [tok.decode(r) for r in runs] == ["mu senpa.[unused10]", "exdef 的[unused10]"]
    assert all(r[-1] == OPENPANGU.eos_id(tok) == 4 for r in runs)
    ids_gen, mask_gen = OPENPANGU.encode_chat(tok, MULTI, add_generation_prompt=True)
    assert tok.decode(ids_gen[-3:]) == "[unused9]助手：" and not any(mask_gen[-3:])


GENERIC_DICT = {
    "name": "chatml-like",
    "role_prefix": {"system": "<|im_start|>system\n", "user": "<|im_start|>user\n",
                    "assistant": "<|im_start|>assistant\n"},
    "role_suffix": {"system": "[unused10]\n", "user": "[unused10]\n", "assistant": "[unused10]\n"},
    "generation_prompt": "<|im_start|>assistant\n",
    "eos_piece": "[unused10]",
    "default_system": "Be brief.",
    "add_bos": False,
}


def test_generic_template_from_dict(tok):
    tpl = ChatTemplate.from_dict(GENERIC_DICT)
    msgs = [{"role": "user", "content": "ka"}, {"role": "assistant", "content": "to"}]
    assert tpl.render(msgs, True) == (
        "<|im_start|>system\nBe brief.[unused10]\n<|im_start|>user\nka[unused10]\n"
        "<|im_start|>assistant\nto[unused10]\n<|im_start|>assistant\n")
    ids, mask = tpl.encode_chat(tok, msgs, add_generation_prompt=False)
    assert ids[0] != tok.bos_id
    assert [tok.decode(r) for r in _masked_runs(ids, mask)] == ["to[unused10]"]   # not the "\n"
    assert ChatTemplate.from_dict(tpl.to_dict()) == tpl
    assert tpl.special_pieces == ("[unused10]",)


def test_builtin_generic_and_base_override():
    generic = get_template("generic")
    assert generic.render([{"role": "user", "content": "hi"}], True) == "User: hi\nAssistant: "
    derived = ChatTemplate.from_dict({"base": "openpangu", "name": "pangu-sys",
                                      "default_system": "你是助手"})
    assert derived.render([], False) == "[unused9]系统：你是助手[unused10]"
    assert derived.role_prefix == OPENPANGU.role_prefix


def test_bad_role_and_bad_messages():
    with pytest.raises(ValueError, match=r"message 1 has unknown role 'robot'"):
        OPENPANGU.render([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], False)
    with pytest.raises(ValueError, match="message 0"):
        OPENPANGU.render([{"role": "user"}], False)
    with pytest.raises(ValueError, match="content must be a string"):
        OPENPANGU.render([{"role": "user", "content": 3}], False)
    with pytest.raises(ValueError, match="list"):
        OPENPANGU.render({"role": "user", "content": "a"}, False)


def test_bad_template_configs():
    with pytest.raises(ValueError, match="colour"):
        ChatTemplate.from_dict({**GENERIC_DICT, "colour": "red"})
    with pytest.raises(ValueError, match="assistant"):
        ChatTemplate.from_dict({**GENERIC_DICT, "role_prefix": {"user": "u"}, "role_suffix": {"user": "u"}})
    with pytest.raises(ValueError, match="differ"):
        ChatTemplate.from_dict({**GENERIC_DICT, "role_suffix": {"assistant": "x"}})
    with pytest.raises(ValueError, match="lacks keys"):
        ChatTemplate.from_dict({"name": "x"})
    with pytest.raises(ValueError, match="nonexistent"):
        get_template("nonexistent")


def test_special_piece_missing_from_vocab(tok):
    tpl = ChatTemplate.from_dict({**GENERIC_DICT, "eos_piece": "<|im_end|>"})
    with pytest.raises(KeyError, match=r"<\|im_end\|>"):
        tpl.encode_chat(tok, [{"role": "user", "content": "a"}], False)


def test_conversation_sentences_chunking():
    msgs = [{"role": "user", "content": "ab\ncdefgh\nij"}, {"role": "assistant", "content": ""},
            {"role": "assistant", "content": "0123456789"}]
    assert list(conversation_sentences([msgs], max_sentence_chars=8)) == \
        ["ab\n", "cdefgh\n", "ij", "01234567", "89"]


def test_template_pickles():
    import pickle
    assert pickle.loads(pickle.dumps(OPENPANGU)) == OPENPANGU


DEMO_MODEL = Path(__file__).resolve().parent.parent / "eagle_ms/assets/demo/tokenizer.model"


@pytest.mark.skipif(not DEMO_MODEL.is_file(), reason="demo tokenizer not built")
def test_demo_tokenizer_asset():
    demo = Tokenizer(DEMO_MODEL)
    assert demo.vocab_size == 8000
    assert [demo.id_to_token(i) for i in range(11)] == ["<unk>", "<s>", "</s>", *OPENPANGU_PIECES]
    ids, mask = OPENPANGU.encode_chat(demo, MULTI, add_generation_prompt=True)
    assert ids == [demo.bos_id] + demo.encode(OPENPANGU.render(MULTI, True))
    assert demo.decode([i for i, m in zip(ids, mask) if m]) == "mu senpa.[unused10]"
