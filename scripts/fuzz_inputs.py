"""Damaged-input fuzz run: every case feeds one damaged checkpoint, draft, config, prompt or data file to
the real ``eagle-ms`` CLI (in this process, ``eagle_ms.cli.main``) and classifies what happened:

    clear error     exit code 2 (or 1/3 where documented) with one ``error:`` line naming the problem
    correct result  exit 0 and the output checked (a valid edge case must still work)
    traceback       an exception escaped ``main`` (or a Python traceback was printed)
    silent-wrong    exit 0 although the input is damaged (or a valid input was refused)

    python scripts/fuzz_inputs.py [--work DIR] [--only SUBSTRING] [--json]

Prints one line per case and the four counts; exits 1 unless there are 0 tracebacks and 0 silent-wrong.
The inputs are made here from the tiny config (configs/tiny.yaml): a seeded random teacher and draft
saved in the project's own formats, then damaged one way per case. tests/test_fuzz_inputs.py runs every
damaged case (the valid edge cases, which compile graphs, run here only).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import struct
import sys
import tempfile
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
TINY = os.path.join(REPO, "configs", "tiny.yaml")


# ------------------------------------------------------------------------------------ made inputs

def _tiny_cfg():
    from eagle_ms.config import load_config

    return load_config(TINY)


def make_teacher(out: str, dtype: str = "float32") -> str:
    from eagle_ms.weights import random_teacher_state, save_teacher_checkpoint

    cfg = _tiny_cfg()
    save_teacher_checkpoint(random_teacher_state(cfg.model, 3), cfg.model, out, dtype=dtype)
    return out


def make_draft(out: str) -> str:
    from eagle_ms.draft_weights import default_draft_config, random_draft_state, save_draft_checkpoint

    cfg = _tiny_cfg()
    dcfg = default_draft_config(cfg.model, draft_vocab_size=512)
    save_draft_checkpoint(random_draft_state(dcfg, 4, used_tokens=list(range(0, 1024, 2))), dcfg, out)
    return out


def _header(path: str) -> tuple[dict, int]:
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n)), n


def _rewrite_header(path: str, edit) -> None:
    """Apply ``edit(header)`` and write the file back with the same data section."""
    header, n = _header(path)
    with open(path, "rb") as fh:
        data = fh.read()[8 + n:]
    edit(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw + data)


def _poke(path: str, key: str, value_bytes: bytes) -> None:
    """Overwrite the first element of tensor ``key`` with ``value_bytes``."""
    header, n = _header(path)
    begin = header[key]["data_offsets"][0]
    with open(path, "r+b") as fh:
        fh.seek(8 + n + begin)
        fh.write(value_bytes)


def _truncate(path: str, size) -> None:
    total = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.truncate(size(total) if callable(size) else size)


def _write(path: str, text: str | None = None, raw: bytes | None = None) -> None:
    """Create ``path`` (and its directory) holding ``raw`` bytes or ``text``; neither: only the directory."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if raw is not None:
        with open(path, "wb") as fh:
            fh.write(raw)
    elif text is not None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def _edit_json(path: str, edit) -> None:
    with open(path, encoding="utf-8") as fh:
        obj = json.load(fh)
    obj = edit(obj)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(obj, fh)


def _first_key(path: str, contains: str = "") -> str:
    header, _ = _header(path)
    return next(k for k in header if k != "__metadata__" and contains in k)


def _shift_offsets(delta_first: int, delta_len: int):
    def edit(h):
        k = next(k for k in h if k != "__metadata__")
        b, e = h[k]["data_offsets"]
        h[k]["data_offsets"] = [b + delta_first, e + delta_first + delta_len]
    return edit


# ------------------------------------------------------------------------------------ cases

class Case:
    def __init__(self, name: str, kind: str, argv, expect: str = "error", damage=None, check=None, rc=2):
        self.name, self.kind, self.argv, self.expect = name, kind, argv, expect
        self.damage, self.check, self.rc = damage, check, rc


def _gen(*extra):
    return ["generate", "--config", TINY, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--json",
            "--no-warmup", *extra]


def _ok_tokens(n):
    def check(out):
        report = json.loads(out.strip().splitlines()[-1])
        return len(report["tokens"]) == n
    return check


def teacher_cases(work: str) -> list[Case]:
    def ckpt(name):
        return os.path.join(work, "teacher", name)

    def gen_with(name):
        return _gen("--set", f"model.checkpoint={ckpt(name)}")

    st = "model.safetensors"
    out = []

    def add(name, damage, expect="error", dtype="float32", check=None):
        def setup(name=name, damage=damage, dtype=dtype):
            make_teacher(ckpt(name), dtype)
            if damage is not None:
                damage(ckpt(name))
        out.append(Case(f"teacher/{name}", "checkpoint", gen_with(name), expect, setup, check))

    add("intact", None, "ok", check=_ok_tokens(2))
    add("intact-fp16", None, "ok", dtype="float16", check=_ok_tokens(2))
    add("intact-bf16", None, "ok", dtype="bfloat16", check=_ok_tokens(2))
    add("empty-file", lambda d: _truncate(os.path.join(d, st), 0))
    add("four-bytes", lambda d: _truncate(os.path.join(d, st), 4))
    add("half-header", lambda d: _truncate(os.path.join(d, st), lambda t: 8 + (_header(os.path.join(d, st))[1] // 2)))
    add("half-data", lambda d: _truncate(os.path.join(d, st), lambda t: t // 2))
    add("last-byte-missing", lambda d: _truncate(os.path.join(d, st), lambda t: t - 1))
    add("trailing-garbage", lambda d: open(os.path.join(d, st), "ab").write(b"\0" * 64))

    def huge_header(d):
        with open(os.path.join(d, st), "r+b") as fh:
            fh.write(struct.pack("<Q", 1 << 60))
    add("header-length-huge", huge_header)

    def header_not_json(d):
        p = os.path.join(d, st)
        _, n = _header(p)
        with open(p, "r+b") as fh:
            fh.seek(8)
            fh.write(b"{not json" + b" " * (n - 9))
    add("header-not-json", header_not_json)
    add("header-entry-no-dtype", lambda d: _rewrite_header(os.path.join(d, st), lambda h: h[_first_key(os.path.join(d, st))].pop("dtype")))
    add("dtype-unknown", lambda d: _rewrite_header(os.path.join(d, st), lambda h: h[_first_key(os.path.join(d, st))].update(dtype="F8_E9")))
    add("shape-wrong-count", lambda d: _rewrite_header(os.path.join(d, st), lambda h: h[_first_key(os.path.join(d, st))].update(shape=[3, 3])))
    add("offsets-reversed", lambda d: _rewrite_header(os.path.join(d, st), lambda h: h[_first_key(os.path.join(d, st))].update(
        data_offsets=h[_first_key(os.path.join(d, st))]["data_offsets"][::-1])))
    add("offsets-past-end", lambda d: _rewrite_header(os.path.join(d, st), _shift_offsets(10 ** 9, 0)))

    def overlap(d):
        p = os.path.join(d, st)

        def edit(h):
            keys = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
            a, b = keys[0], keys[1]
            size_b = h[b]["data_offsets"][1] - h[b]["data_offsets"][0]
            start = h[a]["data_offsets"][0]
            if h[a]["data_offsets"][1] - start >= size_b and h[a]["shape"] and True:
                h[b]["data_offsets"] = [start, start + size_b]  # b now reads inside a
        _rewrite_header(p, edit)
    add("offsets-overlap", overlap)

    def gap(d):
        p = os.path.join(d, st)
        header, n = _header(p)
        with open(p, "rb") as fh:
            data = fh.read()[8 + n:]
        for k, v in header.items():
            if k != "__metadata__":
                v["data_offsets"] = [v["data_offsets"][0] + 16, v["data_offsets"][1] + 16]
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(p, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw + b"\0" * 16 + data)
    add("data-gap", gap)
    add("nan-weight", lambda d: _poke(os.path.join(d, st), _first_key(os.path.join(d, st), "q_proj.weight"),
                                     struct.pack("<f", float("nan"))))
    add("inf-weight", lambda d: _poke(os.path.join(d, st), _first_key(os.path.join(d, st), "mlp"),
                                     struct.pack("<f", float("inf"))))
    add("f16-relabelled-bf16", lambda d: _rewrite_header(os.path.join(d, st), lambda h: [
        v.update(dtype="BF16") for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F16"]), dtype="float16")

    def drop_key(d):
        p = os.path.join(d, st)
        from eagle_ms.safetensors_format import read_safetensors, write_safetensors

        t = read_safetensors(p)
        t.pop(_first_key(p, "down_proj"))
        write_safetensors(p, t)
    add("missing-tensor", drop_key)

    def extra_key(d):
        p = os.path.join(d, st)
        import numpy as np

        from eagle_ms.safetensors_format import read_safetensors, write_safetensors

        t = read_safetensors(p)
        t["model.layers.99.mlp.up_proj.weight"] = np.zeros((2, 2), np.float32)
        write_safetensors(p, t)
    add("unexpected-tensor", extra_key)

    def wrong_shape(d):
        p = os.path.join(d, st)
        import numpy as np

        from eagle_ms.safetensors_format import read_safetensors, write_safetensors

        t = read_safetensors(p)
        k = _first_key(p, "norm")
        t[k] = np.ones(t[k].size + 1, np.float32)
        write_safetensors(p, t)
    add("tensor-wrong-shape", wrong_shape)
    add("config-json-not-json", lambda d: open(os.path.join(d, "config.json"), "w").write("{oops"))
    add("config-json-list", lambda d: open(os.path.join(d, "config.json"), "w").write("[1, 2]"))
    add("config-hidden-size", lambda d: _edit_json(os.path.join(d, "config.json"), lambda o: {**o, "hidden_size": 128}))
    add("config-eos", lambda d: _edit_json(os.path.join(d, "config.json"), lambda o: {**o, "eos_token_id": 7}))
    add("config-aux-layers", lambda d: _edit_json(os.path.join(d, "config.json"),
                                                  lambda o: {**o, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}))
    add("config-max-positions", lambda d: _edit_json(os.path.join(d, "config.json"),
                                                     lambda o: {**o, "max_position_embeddings": 64}))
    add("config-json-absent", lambda d: os.remove(os.path.join(d, "config.json")), "ok", check=_ok_tokens(2))
    add("no-weights-file", lambda d: os.remove(os.path.join(d, st)))

    def bad_index(d):
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as fh:
            json.dump({"weight_map": {"model.norm.weight": "model-00009-of-00009.safetensors"}}, fh)
    add("index-to-missing-shard", bad_index)
    add("index-not-json", lambda d: open(os.path.join(d, "model.safetensors.index.json"), "w").write("nope"))
    out.append(Case("teacher/path-missing", "checkpoint", _gen("--set", f"model.checkpoint={ckpt('nowhere')}")))
    return out


def draft_cases(work: str) -> list[Case]:
    def path(name):
        return os.path.join(work, "draft", name)

    out = []

    def add(name, damage, expect="error", check=None):
        def setup(name=name, damage=damage):
            make_draft(path(name))
            if damage is not None:
                damage(path(name))
        out.append(Case(f"draft/{name}", "draft", _gen("--draft", "eagle3", "--set", f"speculative.draft_path={path(name)}",
                                                         "--budget", "4", "--max-depth", "3", "--top-k", "2"),
                        expect, setup, check))

    st = "model.safetensors"
    add("intact", None, "ok", check=_ok_tokens(2))
    add("config-missing", lambda d: os.remove(os.path.join(d, "config.json")))
    add("config-not-json", lambda d: open(os.path.join(d, "config.json"), "w").write("{"))
    add("config-list", lambda d: open(os.path.join(d, "config.json"), "w").write("[]"))
    add("config-number", lambda d: open(os.path.join(d, "config.json"), "w").write("5"))
    add("config-no-hidden", lambda d: _edit_json(os.path.join(d, "config.json"),
                                                 lambda o: {k: v for k, v in o.items() if k != "hidden_size"}))
    add("config-hidden-mismatch", lambda d: _edit_json(os.path.join(d, "config.json"), lambda o: {**o, "hidden_size": 32}))
    add("config-bias", lambda d: _edit_json(os.path.join(d, "config.json"), lambda o: {**o, "bias": True}))
    add("weights-missing", lambda d: os.remove(os.path.join(d, st)))
    add("weights-truncated", lambda d: _truncate(os.path.join(d, st), lambda t: t // 3))
    add("weights-nan", lambda d: _poke(os.path.join(d, st), _first_key(os.path.join(d, st), "fc"),
                                       struct.pack("<f", float("nan"))))

    def d2t(value):
        def damage(d):
            p = os.path.join(d, st)
            from eagle_ms.safetensors_format import read_safetensors, write_safetensors

            t = read_safetensors(p)
            arr = t["d2t"].copy()
            arr[-1] = value(arr)
            t["d2t"] = arr
            write_safetensors(p, t)
        return damage
    add("d2t-past-vocab", d2t(lambda a: 10 ** 6))
    add("d2t-negative-target", d2t(lambda a: -(len(a) + 5)))

    def t2d_shape(d):
        p = os.path.join(d, st)
        import numpy as np

        from eagle_ms.safetensors_format import read_safetensors, write_safetensors

        t = read_safetensors(p)
        t["t2d"] = np.ones(3, bool)
        write_safetensors(p, t)
    add("t2d-wrong-shape", t2d_shape)
    out.append(Case("draft/path-missing", "draft", _gen("--draft", "eagle3", "--set",
                                                        f"speculative.draft_path={path('nowhere')}")))
    return out


def config_cases(work: str) -> list[Case]:
    tokenizer = os.path.join(REPO, "eagle_ms", "assets", "demo", "tokenizer.model")
    tiny = open(TINY, encoding="utf-8").read().replace("eagle_ms/assets/demo/tokenizer.model", tokenizer)
    out = []

    def add(name, text, expect="error", files=None, check=None, raw=None):
        target = os.path.join(work, "config", name, "c.yaml")

        def setup(text=text, files=files, target=target):
            for rel, content in (files or {}).items():
                _write(os.path.join(os.path.dirname(target), rel), content)
            _write(target, text, raw)
        argv = ["generate", "--config", target, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--json", "--no-warmup"]
        out.append(Case(f"config/{name}", "config", argv, expect, setup, check))

    def sub(old, new):
        assert old in tiny, old
        return tiny.replace(old, new)

    add("missing-file", None)
    add("empty", "")
    add("not-yaml", "model: [1, 2\n")
    add("top-level-list", "- a\n- b\n")
    add("binary", None, raw=b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    add("cycle-self", "base_config: c.yaml\n")
    add("cycle-three", "base_config: a.yaml\n", files={"a.yaml": "base_config: b.yaml\n", "b.yaml": "base_config: c.yaml\n"})
    add("base-missing", "base_config: nope.yaml\n")
    add("base-number", "base_config: 5\n")
    add("inherits-shipped", f"base_config: {TINY}\ngeneration:\n  max_new_tokens: 2\n", "ok", check=_ok_tokens(2))
    add("top-level-typo", tiny + "runtim:\n  seq_length: 16\n")
    add("section-key-typo", sub("  seq_length:", "  seq_lenght:"))
    add("section-not-mapping", tiny + "generation: 5\n")
    add("seq-length-string", sub("  seq_length: 512", "  seq_length: big"))
    add("seq-length-negative", sub("  seq_length: 512", "  seq_length: -1"))
    add("seq-length-bool", sub("  seq_length: 512", "  seq_length: true"))
    add("seq-length-float", sub("  seq_length: 512", "  seq_length: 1.5"))
    add("prefill-chunk-too-big", sub("  seq_length: 512", "  seq_length: 8"))
    add("unknown-device", sub("  device_target: CPU", "  device_target: TPU"))
    add("kv-heads-not-dividing", sub("    num_key_value_heads: 2", "    num_key_value_heads: 3"))
    add("aux-layers-bad", sub("    aux_layer_ids: null", "    aux_layer_ids: [0, 0, 1]"))
    add("eos-outside-vocab", sub("    eos_token_id:", "    eos_token_id: 99999 #"))
    add("windows-bad", sub("  seq_length: 512", "  seq_length: 512\n  attention_windows: [0]"))
    add("tokenizer-missing-file", sub(f"  model_file: {tokenizer}", "  model_file: /nonexistent/tok.model"))
    add("mindformers-section-kept", tiny + "context:\n  mode: 0\n", "ok", check=_ok_tokens(2))
    for item in ("=5", "runtim.seq_length=16", "runtime.seq_length=[1", "runtime=5", "noequals",
                 "speculative.budget=abc", "runtime.seq_length=", "speculative.mode=fast"):
        out.append(Case(f"set/{item}", "config", _gen("--set", item)))
    return out


def prompt_cases(work: str) -> list[Case]:
    out = []
    for ids, expect, n in (("", "error", 0), (" , ", "error", 0), ("1,-5,3", "error", 0), ("1,2,8000", "error", 0),
                           ("1,x", "error", 0), ("1.5", "error", 0), ("1,,2", "error", 0),
                           ("99999999999999999999", "error", 0), (",".join(["5"] * 600), "error", 0),
                           ("0", "ok", 2), ("7999", "ok", 2), (" 4 , 5 ", "ok", 2), ("-0", "ok", 2)):
        argv = ["generate", "--config", TINY, "--prompt-ids", ids, "--max-new-tokens", "2", "--json", "--no-warmup"]
        out.append(Case(f"prompt/ids={ids[:24]!r}", "prompt", argv, expect, check=_ok_tokens(n) if n else None))
    for flag in ("0", "-1", "x"):
        out.append(Case(f"prompt/max-new-tokens={flag}", "prompt", ["generate", "--config", TINY, "--prompt-ids", "1",
                                                                   "--max-new-tokens", flag, "--json", "--no-warmup"]))
    out.append(Case("prompt/empty-text", "prompt", ["generate", "--config", TINY, "--prompt", "", "--max-new-tokens",
                                                    "2", "--json", "--no-warmup"], "ok", check=_ok_tokens(2)))
    return out


def data_cases(work: str) -> list[Case]:
    out = []
    good = json.dumps({"question_id": 1, "category": "c", "turns": ["Hello there"]})

    def bench(name, content, expect="error", raw=None, check=None):
        root = os.path.join(work, "data", name)

        def setup(content=content, root=root):
            _write(os.path.join(root, "humaneval", "question.jsonl"), content, raw)
        argv = ["bench", "--config", TINY, "--data-dir", root, "--datasets", "humaneval", "--draft", "test",
                "--max-new-tokens", "2", "--warmup-tokens", "1", "--no-progress", "--out", os.path.join(root, "run")]
        out.append(Case(f"bench-data/{name}", "data", argv, expect, setup, check))

    bench("missing-file", None)
    bench("empty", "")
    bench("binary", None, raw=b"\x89PNG\r\n\x1a\n\xff\x00")
    bench("invalid-json", "{oops\n")
    bench("not-object", "[1, 2]\n")
    bench("no-question-id", json.dumps({"turns": ["x"]}) + "\n")
    bench("bool-question-id", json.dumps({"question_id": True, "turns": ["x"]}) + "\n")
    bench("negative-question-id", json.dumps({"question_id": -3, "turns": ["x"]}) + "\n")
    bench("empty-turns", json.dumps({"question_id": 3, "turns": []}) + "\n")
    bench("turn-not-string", json.dumps({"question_id": 3, "turns": [5]}) + "\n")
    bench("duplicate-id", good + "\n" + good + "\n")
    bench("valid", good + "\n", "ok", check=lambda out: "1/1 turns ok" in out and "exact 1/1" in out)
    out.append(Case("bench-data/data-dir-missing", "data", ["bench", "--config", TINY, "--data-dir",
                                                          os.path.join(work, "nowhere"), "--draft", "test",
                                                          "--out", os.path.join(work, "nowhere-run")]))

    def regen(name, content, raw=None):
        path = os.path.join(work, "regen", name, "data.jsonl")

        def setup(content=content, path=path):
            _write(path, content, raw)
        argv = ["regenerate", "--config", TINY, "--data", path, "--out", os.path.join(os.path.dirname(path), "out.jsonl"),
                "--max-new-tokens", "2"]
        out.append(Case(f"regen-data/{name}", "data", argv, "error", setup))

    regen("missing-file", None)
    regen("binary", None, raw=b"\x00\xff\xfe\x81garbage")
    regen("invalid-json", "{oops\n")
    regen("wrong-schema", json.dumps({"id": "a", "conversations": "nope"}) + "\n")
    regen("empty", "")
    out.append(Case("trace-diff/missing-dir", "data", ["trace", "diff", os.path.join(work, "nope-a"),
                                                      os.path.join(work, "nope-b")]))
    return out


# ------------------------------------------------------------------------------------ running

def run_case(case: Case) -> tuple[str, str]:
    """(outcome, detail) of one case; see the module doc."""
    from eagle_ms.cli import main

    if case.damage is not None:
        case.damage()
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(case.argv)
            except SystemExit as exc:  # argparse usage errors and SystemExit messages
                rc = exc.code if isinstance(exc.code, int) else 2
                if not isinstance(exc.code, int) and exc.code is not None:
                    print(exc.code, file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - this is what the fuzz run looks for
        return "traceback", f"{type(exc).__name__}: {exc}"[:300] + " | " + traceback.format_exc().splitlines()[-3][:200]
    text = err.getvalue()
    if "Traceback (most recent call last)" in text:
        return "traceback", text[-300:]
    if case.expect == "ok":
        if rc == 0 and (case.check is None or case.check(out.getvalue())):
            return "correct result", ""
        return "silent-wrong", f"valid input refused or wrong: rc {rc}: {text.strip()[-200:]}"
    if rc == 0:
        return "silent-wrong", f"exit 0 on a damaged input; stdout {out.getvalue()[-150:]!r}"
    errors = [line for line in text.splitlines() if "error:" in line]
    if not errors:
        return "silent-wrong", f"rc {rc} without an error line: {text[-200:]!r}"
    return "clear error", errors[-1][:200]


def all_cases(work: str) -> list[Case]:
    return teacher_cases(work) + draft_cases(work) + config_cases(work) + prompt_cases(work) + data_cases(work)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", help="directory for the damaged inputs (default: a temp dir, removed)")
    p.add_argument("--only", help="run the cases whose name contains this")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    args = p.parse_args(argv)
    os.environ.setdefault("GLOG_v", "3")
    work = args.work or tempfile.mkdtemp(prefix="eagle-ms-fuzz-")
    try:
        cases = [c for c in all_cases(work) if not args.only or args.only in c.name]
        results, counts = [], {"clear error": 0, "correct result": 0, "traceback": 0, "silent-wrong": 0}
        for case in cases:
            outcome, detail = run_case(case)
            counts[outcome] += 1
            results.append({"case": case.name, "kind": case.kind, "outcome": outcome, "detail": detail})
            if not args.json:
                print(f"{outcome:<15} {case.name:<40} {detail}", flush=True)
        summary = {"cases": len(cases), **counts}
        print(json.dumps({"summary": summary, "results": results}) if args.json else
              f"\n{len(cases)} damaged or edge inputs: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        return 0 if counts["traceback"] == 0 and counts["silent-wrong"] == 0 else 1
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
