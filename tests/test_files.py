"""Atomic writes and output-location checks (eagle_ms/files.py) against real OS errors.

* a write that fails half-way leaves the old target and no temp file;
* a full file system: a child process whose RLIMIT_FSIZE makes every file full after 1000 bytes
  (the OS then fails write() with EFBIG, for root too) -- a real ENOSPC needs a full mount, which a
  test cannot make without privileges; the code path (an OSError from write) is the same;
* read-only: a directory where a probe write really fails. chmod 555 stops only non-root users, so as
  root the fixture makes the directory immutable (chattr +i, which stops root on ext4/xfs) and skips
  where neither works; a path below a regular file is unwritable for everybody and is always tested.
"""
import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO

from eagle_ms.files import atomic_write, check_can_create, write_json_atomic


def _temp_files(folder):
    return [name for name in os.listdir(folder) if ".tmp" in name]


def test_a_write_that_fails_half_way_leaves_the_old_target_and_no_temp_file(tmp_path):
    target = str(tmp_path / "summary.json")
    write_json_atomic(target, {"run": 1})

    def half(fh):
        fh.write('{"run": 2, "turns": [')
        raise RuntimeError("died while writing")
    with pytest.raises(RuntimeError):
        atomic_write(target, half)
    assert open(target).read() == '{\n "run": 1\n}' and _temp_files(tmp_path) == []


_FILL = """
import resource, signal, sys
from eagle_ms.files import write_json_atomic
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit, write() then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    write_json_atomic(sys.argv[1], {"tokens": list(range(2000))})
except OSError as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def test_a_full_file_system_is_an_error_naming_the_target(tmp_path):
    target = str(tmp_path / "summary.json")
    write_json_atomic(target, {"run": 1})
    proc = subprocess.run([sys.executable, "-c", _FILL, target], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.stdout.strip() == f"OSError: [Errno 27] File too large: '{target}'", proc.stdout + proc.stderr
    assert open(target).read() == '{\n "run": 1\n}' and _temp_files(tmp_path) == []


def test_a_location_below_a_regular_file_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    for where in (tmp_path / "file", tmp_path / "file" / "draft" / "out"):
        with pytest.raises(NotADirectoryError, match=f"cannot create {where}: {tmp_path / 'file'} is not a dir"):
            check_can_create(str(where))
    with pytest.raises(FileExistsError, match=f"File exists: '{tmp_path / 'file'}'"):  # the parent to create
        write_json_atomic(str(tmp_path / "file" / "x.json"), {})
    check_can_create(str(tmp_path / "new" / "deeper"))  # creatable: fine, and nothing is left
    assert sorted(os.listdir(tmp_path)) == ["file"]


def _writable(folder) -> bool:
    try:
        with open(os.path.join(folder, "probe"), "w"):
            pass
    except OSError:
        return False
    os.remove(os.path.join(folder, "probe"))
    return True


@pytest.fixture
def read_only_dir(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    immutable = False
    if _writable(folder) and shutil.which("chattr"):  # root: permission bits do not stop it
        immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
    try:
        if _writable(folder):
            pytest.skip("no way to make a directory read-only for this user here (root without chattr +i)")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        os.chmod(folder, 0o755)


def test_a_read_only_location_is_named(read_only_dir):
    with pytest.raises(PermissionError, match=f"cannot write {read_only_dir / 'draft'}"):
        check_can_create(str(read_only_dir / "draft"))
    with pytest.raises(PermissionError, match=f"'{read_only_dir / 'summary.json'}'"):
        write_json_atomic(str(read_only_dir / "summary.json"), {})
    assert os.listdir(read_only_dir) == []
