"""Shipped asset manifest: checksums match the files; corruption, extra and missing files are named."""
import hashlib
import json
import os
import shutil

import pytest
from conftest import REPO

import eagle_ms.assets as assets
from eagle_ms.assets import ASSETS_DIR, DEMO_DIR, MANIFEST, AssetError, verify_manifest, write_manifest
from eagle_ms.config import load_config
from eagle_ms.runtime import load_tokenizer


def _shipped_asset_dirs() -> list[str]:
    """Every directory under eagle_ms/assets (the demo pair, and a next pair being built)."""
    return sorted(name for name in os.listdir(ASSETS_DIR) if os.path.isdir(os.path.join(ASSETS_DIR, name)))


def test_the_demo_pair_is_shipped():
    """The demo pair is among the directories checked below (its files are verified there)."""
    assert "demo" in _shipped_asset_dirs()
    with open(os.path.join(DEMO_DIR, MANIFEST), encoding="utf-8") as fh:
        assert "tokenizer.model" in json.load(fh)["files"]


@pytest.mark.parametrize("name", _shipped_asset_dirs())
def test_shipped_assets_match_manifest(name):
    root = os.path.join(ASSETS_DIR, name)
    assert os.path.isfile(os.path.join(root, MANIFEST)), f"{root} has no {MANIFEST}"
    manifest = verify_manifest(root)
    for rel, entry in manifest["files"].items():  # independent recomputation with hashlib
        with open(os.path.join(root, rel), "rb") as fh:
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

