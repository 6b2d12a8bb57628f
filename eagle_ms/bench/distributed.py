"""Rank and world size of a benchmark process (data-parallel evaluation, batch 1 per rank).

Under ``msrun`` (MindSpore 2.9) every process it starts runs the same command with ``MS_ROLE`` set:
``MS_SCHED`` for the scheduler and ``MS_WORKER`` for the N workers; msrun also exports ``RANK_ID``,
``RANK_SIZE``, ``MS_WORKER_NUM``, ``MS_NODE_ID``, ``DEVICE_ID``, ``MS_SCHED_HOST``/``MS_SCHED_PORT``.
``mindspore.communication.init()`` joins the cluster (on CPU with the ``mccl`` backend); in the
scheduler process it runs the scheduler and does not come back (the process exits when the workers
are done), so it must be called before any benchmark work. The rank and world size are then taken
from ``get_rank()`` / ``get_group_size()`` (authoritative, also for multi-node jobs where RANK_ID is
only known after init). No collective op is used: ranks share the run directory (a shared
filesystem for multi-node jobs) and rank 0 merges by waiting for the other ranks' marker files.

Without msrun, ``--rank R --world-size W`` shard by hand (e.g. several jobs writing one directory).
"""
from __future__ import annotations

import os

ROLE_ENV = "MS_ROLE"


def under_msrun() -> bool:
    return os.environ.get(ROLE_ENV) in ("MS_WORKER", "MS_SCHED")


def is_scheduler() -> bool:
    return os.environ.get(ROLE_ENV) == "MS_SCHED"


def job_id() -> str | None:
    """The msrun job this process belongs to, as its scheduler's address (None without msrun).

    The ranks of one job share it and two jobs running at once cannot (one scheduler per port), so
    output locks (eagle_ms/locks.py) tell a sibling rank from a second, independent job by it.
    """
    if not under_msrun():
        return None
    return f"msrun@{os.environ.get('MS_SCHED_HOST')}:{os.environ.get('MS_SCHED_PORT')}"


def init_ranks(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """(rank, world_size): from mindspore.communication under msrun, else the given values, else (0, 1).

    Call after ``mindspore.set_device``. In msrun's scheduler process this does not return normally.
    """
    if under_msrun():
        if rank is not None or world_size is not None:
            raise ValueError("--rank/--world-size are set by msrun; do not pass them under msrun")
        from mindspore.communication import get_group_size, get_rank, init

        init()
        if is_scheduler():  # not reached with MindSpore 2.9 (init serves and exits); be safe anyway
            raise SystemExit(0)
        return int(get_rank()), int(get_group_size())
    if (rank is None) != (world_size is None):
        raise ValueError("--rank and --world-size go together")
    if rank is None:
        return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"--rank {rank} --world-size {world_size}: need 0 <= rank < world_size")
    return rank, world_size
