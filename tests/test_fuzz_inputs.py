"""The damaged-input fuzz run (scripts/fuzz_inputs.py): every damaged checkpoint, draft, config, prompt and
data file must end in a clear error (an ``error:`` line, no traceback, no silent success).

The cases that must succeed (valid edge inputs: each compiles a graph) run in the full script, not here;
the script itself is the second classifier: it runs the real CLI and inspects its exit code and stderr.
"""
import os
import sys

import pytest
from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import fuzz_inputs  # noqa: E402


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return [c for c in fuzz_inputs.all_cases(str(tmp_path_factory.mktemp("fuzz"))) if c.expect == "error"]


def test_at_least_100_distinct_damaged_inputs_over_every_kind(cases):
    assert len(cases) >= 100 and len({c.name for c in cases}) == len(cases)
    assert {c.kind for c in cases} == {"checkpoint", "draft", "config", "prompt", "data"}


def test_every_damaged_input_is_a_clear_error(cases):
    outcomes = {c.name: fuzz_inputs.run_case(c) for c in cases}
    bad = {name: o for name, o in outcomes.items() if o[0] != "clear error"}
    assert bad == {}
