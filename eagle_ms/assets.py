"""Shipped assets (package data under ``eagle_ms/assets/``) and their checksum manifest.

``manifest.json`` in an asset directory maps every file below it (relative path) to its sha256 and size.
``verify_manifest`` raises ``AssetError`` naming the first file that is missing, unlisted, or differs, so a
truncated download or a hand-edited weight file never loads silently.
"""
from __future__ import annotations

import hashlib
import json
import os

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
DEMO_DIR = os.path.join(ASSETS_DIR, "demo")
MANIFEST = "manifest.json"


class AssetError(ValueError):
    """An asset file is missing, unlisted, or does not match its manifest entry."""


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def _asset_files(root: str) -> list[str]:
    files = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            if rel != MANIFEST and not name.endswith((".pyc", ".tmp")):
                files.append(rel.replace(os.sep, "/"))
    return sorted(files)


def write_manifest(root: str) -> dict:
    """(Re)write ``root/manifest.json`` for every file below ``root``; returns the manifest."""
    entries = {rel: {"sha256": sha256_file(os.path.join(root, rel)), "bytes": os.path.getsize(os.path.join(root, rel))}
               for rel in _asset_files(root)}
    manifest = {"files": entries, "total_bytes": sum(e["bytes"] for e in entries.values())}
    tmp = os.path.join(root, MANIFEST + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
    os.replace(tmp, os.path.join(root, MANIFEST))
    return manifest


def verify_manifest(root: str) -> dict:
    """Check every file against ``root/manifest.json``; returns the manifest or raises AssetError."""
    path = os.path.join(root, MANIFEST)
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except FileNotFoundError:
        raise AssetError(f"asset manifest missing: {path}") from None
    except json.JSONDecodeError as exc:
        raise AssetError(f"asset manifest {path} is not valid JSON: {exc}") from None
    listed = manifest.get("files", {})
    for rel in _asset_files(root):
        if rel not in listed:
            raise AssetError(f"{os.path.join(root, rel)} is not listed in {path}")
    for rel, entry in sorted(listed.items()):
        full = os.path.join(root, rel)
        if not os.path.isfile(full):
            raise AssetError(f"asset file missing: {full} (listed in {path})")
        size = os.path.getsize(full)
        if size != entry["bytes"]:
            raise AssetError(f"{full}: {size} bytes, manifest says {entry['bytes']}")
        digest = sha256_file(full)
        if digest != entry["sha256"]:
            raise AssetError(f"{full}: sha256 {digest} differs from the manifest's {entry['sha256']}")
    return manifest
