"""Shipped asset manifest: checksums match the files; corruption, extra and missing files are named."""
import os
import shutil

import pytest

from eagle_ms.assets import DEMO_DIR, AssetError, sha256_file, verify_manifest, write_manifest


def test_shipped_demo_assets_match_manifest():
    manifest = verify_manifest(DEMO_DIR)
    assert "tokenizer.model" in manifest["files"]
    for rel, entry in manifest["files"].items():  # independent recomputation with hashlib
        assert sha256_file(os.path.join(DEMO_DIR, rel)) == entry["sha256"]


def test_corrupt_extra_and_missing_files_are_named(tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(DEMO_DIR, root)
    write_manifest(str(root))
    verify_manifest(str(root))
    with open(root / "tokenizer.model", "r+b") as fh:  # same size, one flipped byte
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
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
