"""The timing scripts' shared options (eagle_ms/bench/calls.py): defaults, and a bad --op-threads refused
before any config is read or any MindSpore setting is made (threads_num can be set once per process)."""
from __future__ import annotations

import argparse

import pytest

from eagle_ms.bench.calls import add_timing_args, timing_runner


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_timing_args(parser)
    return parser.parse_args(argv)


def test_defaults_leave_mindspore_threads_alone():
    args = _parse([])
    assert (args.config, args.set, args.repeats, args.context, args.op_threads) == \
        ("configs/tiny.yaml", [], 30, 256, None)


@pytest.mark.parametrize("threads", ["0", "-2"])
def test_op_threads_below_one_is_refused_first(threads):
    args = _parse(["--op-threads", threads, "--config", "no/such/config.yaml"])
    with pytest.raises(ValueError, match=f"--op-threads = {threads}: must be at least 1"):
        timing_runner(args)
