"""Shipped asset manifest: checksums match the files; corruption, extra and missing files are named."""
import hashlib
import os
import shutil

import pytest
from conftest import REPO

import eagle_ms.assets as assets
from eagle_ms.assets import DEMO_DIR, AssetError, verify_manifest, write_manifest
from eagle_ms.config import load_config
from eagle_ms.runtime import load_tokenizer


def test_shipped_demo_assets_match_manifest():
    manifest = verify_manifest(DEMO_DIR)
    assert "tokenizer.model" in manifest["files"]
    for rel, entry in manifest["files"].items():  # independent recomputation with hashlib
        with open(os.path.join(DEMO_DIR, rel), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == entry["sha256"]


def _flip_byte(path, offset=100):
    with open(path, "r+b") as fh:  # same size, one flipped byte
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_assets_are_verified_where_they_are_loaded(tmp_path, monkeypatch):
    root = tmp_path / "assets"
    shutil.copytree(DEMO_DIR, root / "demo")
    monkeypatch.setattr(assets, "ASSETS_DIR", str(root))
    monkeypatch.setattr(assets, "_VERIFIED", set())
    monkeypatch.setenv(assets.ENV_CACHE, str(tmp_path / "cache"))
    cfg = load_config(os.path.join(REPO, "configs", "demo.yaml"),
                      {"tokenizer.model_file": str(root / "demo" / "tokenizer.model")})
    tokenizer, _ = load_tokenizer(cfg)  # intact: loads (and fills the sha256 memo)
    assert tokenizer.vocab_size == cfg.model.vocab_size
    assert os.path.isfile(tmp_path / "cache" / "asset-sha256.json")
    _flip_byte(root / "demo" / "draft" / "model.safetensors")
    monkeypatch.setattr(assets, "_VERIFIED", set())  # a new process
    with pytest.raises(AssetError, match="draft/model.safetensors: sha256"):
        load_tokenizer(cfg)


def test_corrupt_extra_and_missing_files_are_named(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(DEMO_DIR, root)
    write_manifest(str(root))
    verify_manifest(str(root))
    _flip_byte(root / "tokenizer.model")
    with pytest.raises(AssetError, match="tokenizer.model: sha256"):
        verify_manifest(str(root))
    write_manifest(str(root))
    (root / "extra.bin").write_bytes(b"x")
    with pytest.raises(AssetError, match="extra.bin is not listed"):
        verify_manifest(str(root))
    os.remove(root / "extra.bin")
    os.remove(root / "tokenizer.model")
    with pytest.raises(AssetError, match="asset file missing: .*tokenizer.model"):
        verify_manifest(str(root))
