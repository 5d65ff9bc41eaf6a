"""inq.project: the build runner stops what it started, whenever the stop comes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from inq import project


def test_a_stop_while_the_progress_line_starts_kills_the_build(tmp_path, monkeypatch) -> None:
    """A signal can arrive between the build's start and its progress line: the build dies
    with the caller, as when the stop comes later."""
    pid_file = tmp_path / "pid"

    def stopped_progress_line(*args, **kwargs):
        while not pid_file.exists() or not pid_file.read_text().strip():
            time.sleep(0.01)  # the build runs
        raise KeyboardInterrupt  # what the CLI's signal handler raises

    monkeypatch.setattr(project, "tqdm", stopped_progress_line)
    with pytest.raises(KeyboardInterrupt):
        project.run_build(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], tmp_path, "x")
    state = Path(f"/proc/{int(pid_file.read_text())}/stat")
    assert not state.exists()  # killed and reaped


def test_a_stop_while_the_build_starts_kills_the_build(tmp_path, monkeypatch) -> None:
    """A SIGTERM that arrives after the fork, before Popen returns (a loaded machine), is held
    until the build's process id is known: the build dies with the caller."""
    pid_file = tmp_path / "pid"
    popen = project.subprocess.Popen

    def stopped_while_starting(*args, **kwargs):
        build = popen(*args, **kwargs)
        while not pid_file.exists() or not pid_file.read_text().strip():
            time.sleep(0.01)  # the build runs
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once, inside Popen, unless held
        time.sleep(0.05)
        return build

    def interrupt(signum, frame):
        raise KeyboardInterrupt  # what the CLI's signal handler raises

    monkeypatch.setattr(project.subprocess, "Popen", stopped_while_starting)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            project.run_build(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"], tmp_path, "x")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not Path(f"/proc/{int(pid_file.read_text())}/stat").exists()  # killed and reaped
