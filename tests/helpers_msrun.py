"""Shared pieces of the msrun tests (test_preprocess_msrun.py, test_regenerate_msrun.py,
test_draft_train_msrun.py): a tiny random-weight teacher config, and one launch of a scripts/msrun_*.sh
wrapper with 2 workers on a free port.

Not a conftest: test modules import it (``tests/`` is on ``sys.path``).
"""
from __future__ import annotations

import os
import subprocess

from conftest import REPO, free_port

TOKENIZER = os.path.join(REPO, "eagle_ms", "assets", "demo", "tokenizer.model")


def tiny_teacher_yaml(runtime: str, extra: str = "") -> str:
    """A config YAML: 3-layer, hidden-32 teacher with random weights (``checkpoint: null``, seeded by
    runtime.seed), the demo tokenizer; ``runtime`` is the YAML flow mapping of the runtime section,
    ``extra`` further top-level lines."""
    return f"""
model:
  model_config: {{vocab_size: 8000, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 3,
                 num_attention_heads: 4, num_key_value_heads: 2, eos_token_id: 4}}
  checkpoint: null
tokenizer: {{model_file: {TOKENIZER}, chat_template: openpangu}}
runtime: {runtime}
{extra}"""


def run_msrun(script: str, cwd, log_dir, args: list[str], env: dict | None = None):
    """``bash script --workers 2 ... --log-dir log_dir -- args`` in ``cwd``; returns (CompletedProcess,
    {log file name: text})."""
    cmd = ["bash", script, "--workers", "2", "--master-port", str(free_port()), "--log-dir", str(log_dir), "--",
           *args]
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300)
    logs = {name: (log_dir / name).read_text(errors="replace") for name in os.listdir(log_dir)}
    return proc, logs
