"""Shipped assets (package data under ``eagle_ms/assets/``) and their checksum manifest.

``manifest.json`` in an asset directory maps every file below it (relative path) to its sha256 and size.
``verify_manifest`` raises ``AssetError`` naming the first file that is missing, unlisted, or differs, so a
truncated download or a hand-edited weight file never loads silently. ``check_shipped`` runs it where the
assets are loaded (eagle_ms/runtime.py: teacher checkpoint, tokenizer, draft), once per asset directory and
process, for any configured path inside a shipped asset directory. Its cost is small: sizes always, and
sha256 memoised on (path, size, mtime_ns) in ``EAGLE_MS_CACHE`` (default ``~/.cache/eagle_ms``), so an
unchanged file is hashed once per machine.
"""
from __future__ import annotations

import json
import os

from eagle_ms.files import file_sha256, write_json_atomic

ASSETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
DEMO_DIR = os.path.join(ASSETS_DIR, "demo")
MANIFEST = "manifest.json"
ENV_CACHE = "EAGLE_MS_CACHE"  # directory of the sha256 memo (a cache only; unwritable = no memo)
_VERIFIED: set[str] = set()


class AssetError(ValueError):
    """An asset file is missing, unlisted, or does not match its manifest entry."""


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
    entries = {rel: {"sha256": file_sha256(os.path.join(root, rel)), "bytes": os.path.getsize(os.path.join(root, rel))}
               for rel in _asset_files(root)}
    manifest = {"files": entries, "total_bytes": sum(e["bytes"] for e in entries.values())}
    write_json_atomic(os.path.join(root, MANIFEST), manifest, sort_keys=True)
    return manifest


def _memo_path() -> str:
    cache = os.environ.get(ENV_CACHE) or os.path.join(os.path.expanduser("~"), ".cache", "eagle_ms")
    return os.path.join(cache, "asset-sha256.json")


def check_shipped(path: str | None) -> None:
    """If ``path`` lies inside a shipped asset directory (one holding ``manifest.json`` under
    ``eagle_ms/assets``), verify that directory against its manifest, once per process."""
    if not path:
        return
    full = os.path.abspath(path)
    if os.path.commonpath([full, ASSETS_DIR]) != ASSETS_DIR:
        return
    rel = os.path.relpath(full, ASSETS_DIR).split(os.sep)[0]
    root = os.path.join(ASSETS_DIR, rel)
    if root in _VERIFIED or not os.path.isfile(os.path.join(root, MANIFEST)):
        return
    verify_manifest(root, memo_path=_memo_path())
    _VERIFIED.add(root)


def verify_manifest(root: str, memo_path: str | None = None) -> dict:
    """Check every file against ``root/manifest.json``; returns the manifest or raises AssetError.

    ``memo_path``: sha256 memo (eagle_ms/files.py ``file_sha256``); None hashes every file."""
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
        digest = file_sha256(full, memo_path)
        if digest != entry["sha256"]:
            raise AssetError(f"{full}: sha256 {digest} differs from the manifest's {entry['sha256']}")
    return manifest
