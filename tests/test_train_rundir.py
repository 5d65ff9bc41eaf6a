"""The run directory: one process at a time, no run over another, clean failed starts and stops."""

from __future__ import annotations

import errno
import json
import logging
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import INQ_TRAIN, TINY, inq_train

from inq.errors import ConfigError
from inq.runfiles import INTEGER, LATEST, MASKED, PACKED, SUMMARY
from inq.train.checkpoint import FORMAT, KILL_ENV, save_checkpoint
from inq.train.config import TrainerConfig
from inq.train.rundir import (
    LOCK_NAME,
    LOG_NAME,
    RECORDED_CONFIG,
    RunDir,
    RunStopped,
    Terminated,
    claimed,
    holds_run,
    remove_unused,
)

slow = pytest.mark.slow  # the tests that start inq-train


def start(*overrides: str) -> subprocess.Popen[str]:
    """``inq-train`` in the background, for longer than any test waits (stop it).

    Ctrl-C reaches it even when the tests run as a background job, whose shell ignores SIGINT
    (an ignored signal is inherited, and Python then installs no KeyboardInterrupt handler)."""
    return subprocess.Popen(
        [str(INQ_TRAIN), *TINY, "trainer.float_epochs=10000", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@slow
def test_a_second_process_is_refused_and_a_run_is_never_overwritten(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    first = start(f"hydra.run.dir={run_dir}")
    wait_for(run_dir / "checkpoints" / "latest.pt", first)
    second = inq_train(*TINY, f"hydra.run.dir={run_dir}", check=False)
    assert second.returncode == 1
    assert f"inq-train: error: hydra.run.dir: another inq-train process (pid {first.pid})" in (
        second.stderr
    )
    first.terminate()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 143, err
    assert "[ERROR] - stopped: stopped by SIGTERM; continue from the last checkpoint with: " in (
        (run_dir / "app.log").read_text()
    )  # issue 33: the run's own log says why it stopped

    def files() -> dict[Path, bytes]:  # the run's files (the lock holds the last owner's pid)
        return {
            p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != LOCK_NAME
        }

    before = files()

    again = inq_train(*TINY, f"hydra.run.dir={run_dir}", check=False)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert f"hydra.run.dir: {run_dir} already holds a run: continue it with trainer.resume=" in (
        again.stderr
    )
    assert files() == before


@slow
def test_a_killed_process_leaves_no_stuck_lock(tmp_path: Path) -> None:
    hold = "from pathlib import Path; import os, signal; from inq.train.rundir import RunDir; "
    hold += f"RunDir(Path({str(tmp_path)!r}), 'x'); os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.run([sys.executable, "-c", hold], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert (tmp_path / LOCK_NAME).exists()
    RunDir(tmp_path, "x").release()  # taken at once


@slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["inq.bits=9"],  # refused before the directory is claimed
        ["data=mnist", "data.root=/no/such/dir"],  # refused after: while building the data
    ],  # the other refusals, in-process: test_train_app.py::test_a_run_refuses_bad_input_...
)
def test_a_failed_start_leaves_no_directory(tmp_path: Path, overrides: list[str]) -> None:
    proc = inq_train(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}", check=False)
    assert proc.returncode == 1 and "inq-train: error: " in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
    # Hydra's default directory (outputs/<date>/<time>) goes too
    proc = inq_train(*TINY, *overrides, check=False, cwd=tmp_path)
    assert proc.returncode == 1
    assert not (tmp_path / "outputs").exists()


@slow
def test_resume_continues_in_the_run_directory_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    killed = inq_train(
        *TINY, f"hydra.run.dir={run_dir}", env={"INQ_TRAIN_KILL_AT": "step:11"}, check=False
    )
    assert killed.returncode == -signal.SIGKILL
    stale = run_dir / "checkpoints" / ".latest.pt.abc123.tmp"  # a save the kill cut short
    stale.write_bytes(b"partial")

    other = tmp_path / "elsewhere"
    proc = inq_train(*TINY, f"trainer.resume={run_dir}", f"hydra.run.dir={other}", check=False)
    assert proc.returncode == 1
    assert f"hydra.run.dir: trainer.resume continues the run in {run_dir}, not in {other}" in (
        proc.stderr
    )
    assert not other.exists()

    # without hydra.run.dir: Hydra's timestamped directory is dropped, the run goes on in its own
    inq_train(*TINY, f"trainer.resume={run_dir}", cwd=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert not stale.exists()
    log = (run_dir / "app.log").read_text()
    assert log.count("resuming ") == 1 and "results in" in log
    assert json.loads((run_dir / "summary.json").read_text())["bits"] == 5
    assert (run_dir / ".hydra" / "overrides.yaml").read_text().count("trainer.resume") == 0


@slow
@pytest.mark.parametrize(
    ("sig", "code", "says"),
    [(signal.SIGTERM, 143, "stopped by SIGTERM"), (signal.SIGINT, 130, "interrupted (Ctrl-C)")],
)
def test_a_signal_stops_the_run_with_how_to_resume(
    tmp_path: Path, sig: signal.Signals, code: int, says: str
) -> None:
    run_dir = tmp_path / "run"
    proc = start(f"hydra.run.dir={run_dir}")
    wait_for(run_dir / "checkpoints" / "latest.pt", proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    assert f"inq-train: {says}; continue from the last checkpoint with: inq-train " in err
    assert f"trainer.resume={run_dir}" in err
    assert not list(run_dir.rglob("*.tmp"))
    RunDir(run_dir, "x").release()  # unlocked


@slow
def test_a_full_disk_stops_the_run_with_one_message(tmp_path: Path) -> None:
    """A real failed write: a file size limit (what a full disk does to ``write``) cuts the
    first checkpoint; torch.save itself would report it as a RuntimeError, a traceback."""

    def limit_files() -> None:  # Python ignores SIGXFSZ: the write fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [str(INQ_TRAIN), *TINY, f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_files,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        f"inq-train: cannot write {run_dir}/checkpoints/latest.pt: file too large (a file size "
        "limit, ulimit -f); no checkpoint was saved yet: start the run again"
    )
    assert not run_dir.exists()  # nothing of the start stays


@slow
def test_a_full_disk_under_tensorboard_stops_the_run_with_one_message(tmp_path: Path) -> None:
    """Issue 33: the event file (which outgrows this small model's checkpoints) hits the limit
    in TensorBoard's writer thread, whose traceback was printed into the message."""

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (80_000, 80_000))

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [str(INQ_TRAIN), *TINY, "model.width=4", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=300, preexec_fn=limit_files,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr == (
        f"inq-train: cannot write {run_dir}/tb: file too large (a file size limit, ulimit -f); "
        f"continue from the last checkpoint with: inq-train "
        f"trainer.resume={run_dir}\n"
    )
    inq_train(f"trainer.resume={run_dir}")  # as the message says
    assert (run_dir / "summary.json").is_file()


@slow
def test_resume_takes_the_runs_own_config(tmp_path: Path) -> None:
    """``trainer.resume=DIR`` alone, as the stop message prints it, continues a run that was
    started with overrides; a change that shapes the weights is refused."""
    run_dir, whole = tmp_path / "run", tmp_path / "whole"
    settings = (*TINY, "inq.bits=4", "inq.portions=[0.5,1.0]")
    inq_train(*settings, f"hydra.run.dir={whole}")
    killed = inq_train(*settings, f"hydra.run.dir={run_dir}", env={KILL_ENV: "step:11"},
                       check=False)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    refused = inq_train(f"trainer.resume={run_dir}", "inq.bits=5", check=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "inq.bits=4 (given 5); leave them out" in refused.stderr.splitlines()[-1]
    inq_train(f"trainer.resume={run_dir}", "trainer.log_every=3", cwd=tmp_path)
    assert not (tmp_path / "outputs").exists()  # Hydra's default directory is dropped
    log = (run_dir / "app.log").read_text()
    assert "changed on resume: trainer.log_every=3 (was 2)" in log
    for name in ("model_masked.safetensors", "model.inq.safetensors"):
        assert (run_dir / name).read_bytes() == (whole / name).read_bytes(), name


@slow
def test_a_run_killed_before_its_first_checkpoint_leaves_a_usable_directory(
    tmp_path: Path,
) -> None:
    """Resumed, it starts again from its recorded config (a new run taking the directory:
    :func:`test_claimed_lets_a_new_run_take_the_start_of_one_that_saved_nothing`)."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    settings = (*TINY, "inq.bits=3")
    inq_train(*settings, f"hydra.run.dir={whole}")
    killed = inq_train(*settings, f"hydra.run.dir={run_dir}", env={KILL_ENV: "step:2"},
                       check=False)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    assert holds_run(run_dir) and not (run_dir / "checkpoints" / "latest.pt").exists()
    inq_train(f"trainer.resume={run_dir}")
    assert json.loads((run_dir / "summary.json").read_text())["bits"] == 3  # the recorded config
    for name in ("model_masked.safetensors", "model.inq.safetensors"):
        assert (run_dir / name).read_bytes() == (whole / name).read_bytes(), name
    assert "starting the run again from its recorded config" in (run_dir / "app.log").read_text()
    shutil.rmtree(run_dir)
    killed = inq_train(*settings, f"hydra.run.dir={run_dir}", env={KILL_ENV: "step:2"},
                       check=False)  # fmt: skip
    for recording in ("garbage: [", "- a list\n"):  # a damaged record: one message, kept
        (run_dir / ".hydra" / "config.yaml").write_text(recording)
        proc = inq_train(f"trainer.resume={run_dir}", check=False)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert "its .hydra/config.yaml cannot be read" in proc.stderr.splitlines()[-1]
        assert (run_dir / ".hydra" / "config.yaml").read_text() == recording


def _resume(resume: Path | None = None, allow_nonempty_dir: bool = False) -> TrainerConfig:
    return TrainerConfig(
        resume=None if resume is None else str(resume), allow_nonempty_dir=allow_nonempty_dir
    )


def test_claimed_owns_a_new_run_directory_for_the_block(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    files = {RECORDED_CONFIG: "inq:\n  bits: 4\n"}
    with claimed(_resume(), run_dir, dir_chosen=True, main=True, hydra_files=files) as claim:
        assert claim.home == run_dir and claim.resume_path is claim.recorded is None
        assert not claim.continues
        assert (run_dir / RECORDED_CONFIG).read_text() == "inq:\n  bits: 4\n"
        with pytest.raises(ConfigError, match=r"^hydra\.run\.dir: another inq-train process"):
            RunDir(run_dir, "hydra.run.dir")
        save_checkpoint(run_dir / LATEST, {"format": FORMAT})
    RunDir(run_dir, "hydra.run.dir").release()  # unlocked again
    refused = pytest.raises(ConfigError, match=r"already holds a run: continue it with trainer")
    with refused, claimed(_resume(), run_dir, dir_chosen=True, main=True):
        pass


@pytest.mark.parametrize("name", [MASKED, PACKED, INTEGER, SUMMARY])
def test_a_folder_holding_any_file_a_run_writes_is_taken(tmp_path: Path, name: str) -> None:
    """Issue 33: a folder where ``inq export``/``inq calibrate`` wrote the run's file names was
    free for a new run, which then replaced them."""
    (tmp_path / name).write_bytes(b"an export")
    refused = pytest.raises(ConfigError, match=rf"holds files a run writes \({re.escape(name)}\)")
    with refused, claimed(_resume(allow_nonempty_dir=True), tmp_path, dir_chosen=True, main=True):
        pass
    assert (tmp_path / name).read_bytes() == b"an export"


def test_a_new_run_needs_leave_to_write_into_a_folder_holding_other_files(
    tmp_path: Path,
) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    refused = pytest.raises(ConfigError, match=r"is not empty \(notes\.txt\).*allow_nonempty_dir")
    with refused, claimed(_resume(), tmp_path, dir_chosen=True, main=True):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no lock file left
    with claimed(_resume(allow_nonempty_dir=True), tmp_path, dir_chosen=True, main=True) as claim:
        assert claim.home == tmp_path
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_relative_run_directory_is_claimed_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: summary.json lists the run's files under ``claim.home``; relative ones were
    taken for the cwd's by later commands."""
    monkeypatch.chdir(tmp_path)
    save_checkpoint(tmp_path / "run" / LATEST, {"format": FORMAT})
    with claimed(_resume(Path("run")), Path("run"), dir_chosen=True, main=True) as claim:
        assert claim.home == tmp_path / "run" and claim.resume_path == tmp_path / "run" / LATEST


def test_claimed_continues_a_run_in_its_own_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    save_checkpoint(run_dir / LATEST, {"format": FORMAT})
    cut_short = (run_dir / LATEST).with_name(".latest.pt.x1y2.tmp")  # a save a kill cut short
    cut_short.write_bytes(b"half a save")
    hydra_default = tmp_path / "outputs" / "2024-01-01" / "12-00-00"
    hydra_default.mkdir(parents=True)
    with claimed(_resume(run_dir), hydra_default, dir_chosen=False, main=True) as claim:
        assert (claim.home, claim.resume_path, claim.continues) == (run_dir, run_dir / LATEST, True)
        assert not cut_short.exists()
    assert not (tmp_path / "outputs").exists()  # Hydra's unused default directory is gone
    refused = pytest.raises(ConfigError, match=r"continues the run in .*leave hydra\.run\.dir out")
    with refused, claimed(_resume(run_dir), tmp_path / "other", dir_chosen=True, main=True):
        pass


def _killed_start(run_dir: Path) -> Path:
    """``run_dir`` as a run killed before its first checkpoint leaves it (its start)."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / RECORDED_CONFIG).write_text("inq:\n  bits: 3\n")
    (run_dir / "tb").mkdir()
    return run_dir


def test_claimed_starts_a_run_that_saved_nothing_again_from_its_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inq.train")
    run_dir = _killed_start(tmp_path / "run")
    with claimed(_resume(run_dir), run_dir, dir_chosen=True, main=True) as claim:
        assert (claim.home, claim.resume_path, claim.continues) == (run_dir, None, True)
        assert claim.recorded == {"inq": {"bits": 3}}
        assert not (run_dir / "tb").exists()
    assert "starting the run again from its recorded config" in (run_dir / LOG_NAME).read_text()


def test_claimed_lets_a_new_run_take_the_start_of_one_that_saved_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="inq.train")
    run_dir = _killed_start(tmp_path / "run")
    (run_dir / LOG_NAME).write_text("the killed run's log\n")
    files = {RECORDED_CONFIG: "inq:\n  bits: 5\n"}
    with claimed(_resume(), run_dir, dir_chosen=True, main=True, hydra_files=files) as claim:
        assert (claim.home, claim.resume_path, claim.continues) == (run_dir, None, False)
        assert not (run_dir / "tb").exists()
        assert (run_dir / RECORDED_CONFIG).read_text() == "inq:\n  bits: 5\n"  # its own
    log = (run_dir / LOG_NAME).read_text()
    assert "the killed run's log" not in log and "cleared the start of a run that stopped" in log


def _fail_in(run_dir: Path, dir_chosen: bool, error: BaseException) -> None:
    with claimed(_resume(), run_dir, dir_chosen=dir_chosen, main=True, hydra_files={}):
        raise error


def test_claimed_leaves_nothing_of_a_new_run_that_failed_or_stopped(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "2024-01-01" / "12-00-00"  # as Hydra makes it
    with pytest.raises(ValueError, match="bad model"):
        _fail_in(run_dir, dir_chosen=False, error=ValueError("bad model"))
    assert not (tmp_path / "outputs").exists()
    with pytest.raises(RunStopped) as stop:
        _fail_in(tmp_path / "run", dir_chosen=True, error=KeyboardInterrupt())
    assert stop.value.exit_code == 130
    assert str(stop.value) == (
        "interrupted (Ctrl-C); no checkpoint was saved yet: start the run again"
    )
    assert not (tmp_path / "run").exists()


def test_a_stop_that_a_library_turned_into_another_error_is_still_the_stop(
    tmp_path: Path,
) -> None:
    """OmegaConf, cut by a SIGTERM while it builds a node, fails in its cleanup and raises an
    AttributeError while handling the stop (CI, stop 64): the run reports the stop."""
    with pytest.raises(RunStopped) as stop, claimed(_resume(), tmp_path / "run", True, True):
        try:
            raise Terminated
        finally:  # OmegaConf's flag_override restoring the flags of a node half built
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
    assert stop.value.exit_code == 143
    assert str(stop.value).startswith("stopped by SIGTERM; ")


def test_a_run_that_saved_keeps_its_directory_when_it_stops(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stopped = pytest.raises(RunStopped, match=r"disk full .*continue from the last checkpoint with")
    with stopped, claimed(_resume(), run_dir, dir_chosen=True, main=True):
        save_checkpoint(run_dir / LATEST, {"format": FORMAT})
        raise OSError(errno.ENOSPC, "No space left on device")
    assert (run_dir / LATEST).is_file()


def test_remove_unused_removes_empty_directories_only(tmp_path: Path) -> None:
    run_dir = tmp_path / "outputs" / "day" / "time"
    run_dir.mkdir(parents=True)
    remove_unused(run_dir, dir_chosen=True)  # chosen: its parents are the user's
    assert not run_dir.exists() and (tmp_path / "outputs" / "day").exists()
    run_dir.mkdir()
    (run_dir / "kept").touch()
    remove_unused(run_dir, dir_chosen=False)
    assert (run_dir / "kept").exists()
    (run_dir / "kept").unlink()
    remove_unused(run_dir, dir_chosen=False)
    assert not (tmp_path / "outputs").exists()
