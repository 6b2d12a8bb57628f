"""The package layout rules of docs/architecture.md §"Where things live", checked on the source (ast only).

* every module under eagle_ms/ is at most MAX_LINES lines;
* graph code (eagle_ms/models/) imports nothing from the package root but eagle_ms.config;
* eagle_ms/config.py imports only eagle_ms/config_yaml.py, which imports no eagle_ms module (the bottom);
* the core modules import nothing from eagle_ms.bench or eagle_ms.train;
* os.replace appears only in eagle_ms/files.py (the atomic-write helper);
* the README layout and the architecture table name every module.
"""
import ast
import os

import pytest
from conftest import REPO

PACKAGE = os.path.join(REPO, "eagle_ms")
MAX_LINES = 400
CORE = ("generate", "teacher", "tree", "tree_checks", "verify", "cache", "trace", "metrics", "config", "files",
        "token_ids")


def _modules():
    for dirpath, _, names in os.walk(PACKAGE):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, REPO).replace(os.sep, "/"), path


def _eagle_imports(path):
    """Every eagle_ms module a file imports (absolute names), at any depth of the file."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("eagle_ms")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("eagle_ms"):
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if node.module == "eagle_ms"}
    return out


def test_no_module_is_a_god_file():
    sizes = {rel: sum(1 for _ in open(path, encoding="utf-8")) for rel, path in _modules()}
    assert {rel: n for rel, n in sizes.items() if n > MAX_LINES} == {}


def test_graph_code_imports_only_config_and_files_from_the_root():
    for rel, path in _modules():
        if rel.startswith("eagle_ms/models/"):
            bad = {m for m in _eagle_imports(path)
                   if not m.startswith(("eagle_ms.models", "eagle_ms.config", "eagle_ms.files"))}
            assert not bad, f"{rel} imports {sorted(bad)}"


def test_config_and_core_layers():
    assert _eagle_imports(os.path.join(PACKAGE, "config.py")) == {"eagle_ms.config_yaml"}
    assert _eagle_imports(os.path.join(PACKAGE, "config_yaml.py")) == set()
    for name in CORE:
        bad = {m for m in _eagle_imports(os.path.join(PACKAGE, f"{name}.py"))
               if m.startswith(("eagle_ms.bench", "eagle_ms.train"))}
        assert not bad, f"eagle_ms/{name}.py imports {sorted(bad)}"


def test_atomic_writes_have_one_home():
    users = [rel for rel, path in _modules() if "os.replace" in open(path, encoding="utf-8").read()]
    assert users == ["eagle_ms/files.py"]


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_docs_name_every_module(doc):
    text = open(os.path.join(REPO, doc), encoding="utf-8").read()
    if doc == "README.md":
        text = text[text.index("## Layout"):text.index("## Scripts")]
    else:
        text = text[text.index("## Where things live"):text.index("## Data flow")]
    missing = []
    for rel, _ in _modules():
        if rel.endswith("__init__.py"):
            continue
        short = rel[len("eagle_ms/"):]
        base = os.path.basename(rel)
        if rel not in text and f"`{short}`" not in text and f"`{base}`" not in text and base not in text:
            missing.append(rel)
    assert missing == []
