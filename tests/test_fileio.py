"""Atomic writes (inq.fileio): a reader sees the old file or the complete new one."""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from inq.fileio import (
    atomic_dir,
    atomic_path,
    describe_os_error,
    digest_problem,
    metadata_int,
    read_safetensors,
    write_safetensors,
)
from inq.masked import save_masked
from inq.packed import export_packed
from inq.scheduler import INQScheduler


class BodyFailed(Exception):
    pass


def test_a_killed_writers_temporary_goes_with_the_next_write(tmp_path: Path) -> None:
    """A SIGKILL leaves ``.<name>.<host>-<pid>.*.tmp``; the next write to that file deletes it
    once its process is gone, and never a live writer's or another file's."""
    target = tmp_path / "model.inq.safetensors"
    script = (
        "import os, signal, sys; from inq.fileio import atomic_path\n"
        "with atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'half'); os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(target)], check=False)
    assert killed.returncode == -9
    (left,) = tmp_path.glob(".model.inq.safetensors.*.tmp")
    live = left.with_name(re.sub(r"-\d+\.", f"-{os.getpid()}.", left.name, count=1))
    live.write_bytes(b"a write in progress")
    other = tmp_path / left.name.replace("model.inq", "other")
    other.write_bytes(b"another file's")
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"whole")
    assert target.read_bytes() == b"whole"
    assert not left.exists() and live.exists() and other.exists()


def test_a_failed_write_names_its_file(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    with pytest.raises(OSError) as err, atomic_path(target):
        raise OSError(28, "No space left on device")
    assert err.value.filename == str(target) and not list(tmp_path.iterdir())


def test_a_write_the_folder_refuses_names_the_target_not_its_temporary(
    tmp_path: Path, monkeypatch
) -> None:
    """A read-only folder: mkstemp fails naming the temporary it tried; the user named the
    target, and that is what the error says."""
    target = tmp_path / "x.onnx"

    def refused(prefix: str, suffix: str, dir: Path) -> tuple[int, str]:
        raise PermissionError(13, "Permission denied", str(Path(dir) / f"{prefix}abc{suffix}"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError) as err, atomic_path(target):
        pass
    assert str(err.value) == f"[Errno 13] Permission denied: '{target}'"


def test_a_failed_rename_names_the_target(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    target.mkdir()  # os.replace(file, directory) fails naming both
    with pytest.raises(OSError) as err, atomic_path(target) as tmp:
        tmp.write_bytes(b"data")
    assert err.value.filename == str(target) and err.value.filename2 is None
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_writes_the_new_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.bin"
    with atomic_path(target) as tmp:
        assert tmp != target and tmp.parent == target.parent
        assert not target.exists(), "the target appeared before the body finished"
        tmp.write_bytes(b"new contents")
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_replaces_an_existing_file(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.bin"
    target.write_bytes(b"old")
    with atomic_path(str(target)) as tmp:
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old", "the old file changed while writing"
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_old_file_untouched_when_the_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "ckpt.bin"
    target.write_bytes(b"old and good")
    with pytest.raises(BodyFailed), atomic_path(target) as tmp:
        tmp.write_bytes(b"half writ")
        raise BodyFailed
    assert target.read_bytes() == b"old and good"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.bin"]


def test_no_file_created_when_the_body_raises(tmp_path: Path) -> None:
    target = tmp_path / "never.bin"
    with pytest.raises(BodyFailed), atomic_path(target):
        raise BodyFailed
    assert list(tmp_path.iterdir()) == []


def test_creates_missing_parent_directories(tmp_path: Path) -> None:
    target = tmp_path / "runs" / "a" / "b" / "last.ckpt"
    with atomic_path(target) as tmp:
        tmp.write_text("ok")
    assert target.read_text() == "ok"


def test_the_file_gets_the_mode_of_a_plain_open(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with atomic_path(tmp_path / "summary.json") as tmp:
            tmp.write_text("{}")
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_safetensors_exports_get_the_umask_mode(tmp_path: Path, mask: int) -> None:
    """safetensors' save_file recreates its file as 0600; the export must still get the mode a
    plain open() gives (issue 12), checked on real masked and packed exports."""
    net = nn.Sequential(nn.Linear(6, 4))
    sched = INQScheduler(net, bits=4, portions=(1.0,))
    sched.step()
    old = os.umask(mask)
    try:
        save_masked(tmp_path / "m.safetensors", net, sched)
        export_packed(tmp_path / "m.safetensors", tmp_path / "p.safetensors")
        write_safetensors(tmp_path / "t.safetensors", {"w": torch.ones(2)}, {})
    finally:
        os.umask(old)
    for name in ("m", "p", "t"):
        assert (tmp_path / f"{name}.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask, name


@pytest.mark.parametrize("value", [-2.0, True, "3", None])
def test_metadata_int_refuses_what_is_not_an_int(value) -> None:
    assert metadata_int(-2) == -2
    with pytest.raises(TypeError, match="expected an integer"):
        metadata_int(value)


WRITE = """
import sys, torch
from inq.fileio import write_safetensors
tensors = {"w": torch.arange(6.0).reshape(2, 3), "codes": torch.arange(5, dtype=torch.uint8),
           "mask": torch.ones(4, dtype=torch.bool), "steps": torch.tensor(7)}
write_safetensors(sys.argv[1], tensors, {f"key{i}": str(i) for i in range(12)})
"""


def test_the_same_contents_give_the_same_bytes_in_every_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byte-reproducible files (issue 12): safetensors' writer orders the metadata by a hash map
    seeded per process, so before this every process wrote other bytes (two processes rarely
    ordered a dozen keys alike). This process writes one file, a new one the other."""
    files = [tmp_path / f"{i}.safetensors" for i in range(2)]
    monkeypatch.setattr(sys, "argv", ["-c", str(files[0])])
    exec(WRITE, {})
    subprocess.run([sys.executable, "-c", WRITE, str(files[1])], check=True)
    assert files[0].read_bytes() == files[1].read_bytes()
    tensors, metadata = read_safetensors(files[0])  # and any safetensors reader loads it
    assert torch.equal(tensors["w"], torch.arange(6.0).reshape(2, 3))
    assert tensors["mask"].dtype == torch.bool and int(tensors["steps"]) == 7
    assert metadata["key11"] == "11" and digest_problem(tensors, metadata) is None


def test_write_failures_are_named_once() -> None:
    """The cause a user calls it, and the system's words only where they add something."""
    assert describe_os_error(OSError(errno.EROFS, "Read-only file system")) == (
        "read-only file system"
    )
    assert describe_os_error(OSError(errno.EFBIG, "File too large")) == (
        "file too large (a file size limit, ulimit -f)"
    )
    assert describe_os_error(OSError(errno.EIO, "Input/output error")) == "Input/output error"


def test_a_directory_is_replaced_whole_or_not_at_all(tmp_path: Path) -> None:
    target = tmp_path / "project"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(BodyFailed), atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("half")
        raise BodyFailed
    assert [p.name for p in tmp_path.iterdir()] == ["project"]
    assert [p.name for p in target.iterdir()] == ["old.txt"]
    with atomic_dir(target) as tmp:
        (tmp / "new.txt").write_text("whole")
        assert [p.name for p in target.iterdir()] == ["old.txt"]  # untouched until the end
    assert [p.name for p in tmp_path.iterdir()] == ["project"]
    assert [p.name for p in target.iterdir()] == ["new.txt"]


@pytest.mark.parametrize("moment", ["writing", "between the renames"])
def test_a_killed_directory_writer_leaves_the_old_directory_after_the_next_write(
    tmp_path: Path, moment: str
) -> None:
    """SIGKILL while the new directory is written leaves its temporary; between moving the old
    one aside and renaming the new one in (os.rename killed), the old one aside. The next
    write to the same name deletes the first and puts the second back before it starts."""
    target = tmp_path / "project"
    target.mkdir()
    (target / "old.txt").write_text("old")
    kill = "os.kill(os.getpid(), signal.SIGKILL)"
    rename = (
        f"os.rename = lambda a, b, real=os.rename: real(a, b) if str(a) == sys.argv[1] else {kill}"
    )
    script = (
        "import os, signal, sys; from inq.fileio import atomic_dir\n"
        + (rename + "\n" if moment != "writing" else "")
        + "with atomic_dir(sys.argv[1]) as tmp:\n"
        + f"    (tmp / 'new.txt').write_text('half'); {kill if moment == 'writing' else 'pass'}\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(target)], check=False)
    assert killed.returncode == -9
    left = sorted(re.sub(r"-\d+\..*\.tmp$", "-PID.tmp", p.name) for p in tmp_path.iterdir())
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())  # as inq.fileio names it
    if moment == "writing":
        assert left == [f".project.{host}-PID.tmp", "project"]
    else:
        assert [re.sub(r"-\d+\.old$", "-PID.old", n) for n in left] == [
            f".project.{host}-PID.old", f".project.{host}-PID.tmp"]  # fmt: skip
    with pytest.raises(BodyFailed), atomic_dir(target):
        raise BodyFailed  # cleans up first, then fails: the old directory stays
    assert [p.name for p in tmp_path.iterdir()] == ["project"]
    assert [p.name for p in target.iterdir()] == ["old.txt"]
