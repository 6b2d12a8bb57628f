"""One writer per output (eagle_ms/locks.py), with real second processes: the second writer is refused
naming the output and the holder's pid; a killed holder never blocks a rerun; the ranks of one job share
a directory while a rank of another job is refused (whichever of them comes second); msrun_bench.sh
--overwrite does not delete a directory a run is writing."""
import os
import signal
import subprocess
import sys

import pytest
from helpers_locks import REPO, held_elsewhere, start_holder, stop_holder

from eagle_ms.locks import OutputInUseError, holders, lock_dir, lock_file


def test_second_writer_of_a_file_is_refused_naming_it_and_the_holder(tmp_path):
    out = str(tmp_path / "regen.jsonl")
    with held_elsewhere("file", out) as pid:
        with pytest.raises(OutputInUseError, match=rf"{out} is being written by another process \(pid {pid} on"):
            with lock_file(out):
                pass
    with lock_file(out):  # released: the next writer gets it, and its lock file goes with it
        assert os.path.exists(out + ".lock")
    assert not os.path.exists(out + ".lock") and not os.path.exists(out)


def test_a_killed_holder_never_blocks_a_rerun(tmp_path):
    run = str(tmp_path / "run")
    proc, line = start_holder("dir", run)
    assert line == "locked"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.exists(os.path.join(run, ".lock-rank-0"))  # left behind, but nobody holds it
    assert holders(run) == {}
    with lock_dir(run):
        (holder,) = holders(run).values()
        assert holder["pid"] == os.getpid()
    assert os.listdir(run) == []


def test_ranks_of_one_job_share_a_directory_other_jobs_are_refused(tmp_path):
    run = str(tmp_path / "run")
    with held_elsewhere("dir", run, rank=1, world=2, job="msrun@h:1") as pid:
        with lock_dir(run, 0, 2, "msrun@h:1"):  # the sibling rank of the same job
            assert sorted(h["rank"] for h in holders(run).values()) == [0, 1]
        for rank, world, job in ((0, 2, "msrun@h:2"), (0, 1, None), (1, 2, "msrun@h:1")):
            with pytest.raises(OutputInUseError, match=rf"{run} is being written by .*pid {pid}.*rank 1 of 2"):
                with lock_dir(run, rank, world, job):
                    pass
        assert sorted(h["rank"] for h in holders(run).values()) == [1]  # a refused rank released its lock
    with lock_dir(run):  # the other order: the job that locks second is the one refused
        proc, line = start_holder("dir", run, rank=1, world=2, job="msrun@h:1")
        stop_holder(proc)
        assert proc.returncode == 3 and line.startswith(f"refused: {run} is being written by another job")
        assert f"pid {os.getpid()}" in line


def test_sibling_ranks_starting_together_both_get_their_locks(tmp_path):
    run = str(tmp_path / "run")
    for _ in range(3):  # each rank probes the other's lock while the other may be taking it
        procs = [subprocess.Popen([sys.executable, "-c", _SIBLING, run, str(r)], stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": REPO}) for r in (0, 1)]
        outs = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert outs == ["locked", "locked"]


_SIBLING = """
import sys, time
from eagle_ms.locks import lock_dir
with lock_dir(sys.argv[1], int(sys.argv[2]), 2, "msrun@h:9"):
    time.sleep(0.3)
print("locked")
"""


def test_msrun_bench_overwrite_does_not_delete_a_run_being_written(tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    with held_elsewhere("dir", str(run), rank=0, world=2, job="msrun@h:3") as pid:
        proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "msrun_bench.sh"), "2", "bench", "--out",
                               str(run), "--overwrite"], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert f"refusing to delete {run}: a run is writing it (pid {pid}" in proc.stderr
        assert (run / "manifest.json").exists()


def test_msrun_bench_refuses_resume_with_overwrite(tmp_path):
    proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "msrun_bench.sh"), "2", "bench", "--out",
                           str(tmp_path / "run"), "--resume", "--overwrite"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--resume keeps the run" in proc.stderr
    assert not (tmp_path / "run").exists()
