"""``experiments/gpu_check.sh`` (issue 33): without CUDA it stops at once, with one line, a
non-zero exit and nothing written; on a GPU its logs go to LOG_DIR or a temporary directory,
never into the repository, and a failed step makes the exit status non-zero, named in the
summary with its real exit status.

The GPU path runs here with stand-ins on ``PATH``: a ``python3`` that reports CUDA and fakes the
two steps it is asked for (the other calls go to the real interpreter), and an ``nvidia-smi``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "experiments" / "gpu_check.sh"

# A python3 for which torch sees a GPU. With $CALLS set, every other call appends its arguments
# to that file and exits 0 (after $SLEEP seconds); else the static check sleeps past
# STEP_TIMEOUT, the integer check exits with $INTEGER_RC, and the rest is the real interpreter.
FAKE_PYTHON = f"""#!/usr/bin/env bash
case "$*" in
  "-c import torch; print(torch.cuda.is_available())") echo True; exit ;;
  *"import torch, triton"*) echo "torch (stand-in)"; exit ;;
  "-c import omegaconf") exit "${{NO_OMEGACONF:-0}}" ;;
esac
if [[ -n ${{CALLS:-}} ]]; then
  echo "$*" >>"$CALLS"
  exec sleep "${{SLEEP:-0}}"
fi
case "$*" in
  *"bench kernel --static"*) exec sleep 30 ;;
  *gpu_integer_check.py*) exit "$INTEGER_RC" ;;
  *) exec {sys.executable} "$@" ;;
esac
"""
FAKE_NVIDIA_SMI = '#!/bin/sh\necho "name, driver_version"\necho "stand-in GPU, 0"\n'
FAKE_NCU = '#!/bin/sh\necho "ncu $*" >>"$CALLS"\n'


def repo_state() -> str:
    """What ``git status`` reports for the working tree (ignored files included) and the
    listing of ``experiments/gpu/``, so a file the script writes anywhere in it shows."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--ignored=matching"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # other tests (in other pytest-xdist workers too) may write caches meanwhile; what the
    # script writes is what matters here: its logs and results, .log/.txt/.json files
    lines = [line for line in status.splitlines() if line.endswith(SCRIPT_OUTPUTS)]
    return "\n".join(sorted([*lines, *os.listdir(REPO / "experiments" / "gpu")]))


SCRIPT_OUTPUTS = (".log", ".txt", ".json")


def gpu_check(
    *args: str, cwd: Path, env: dict[str, str], path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    # the script's python3 is the tests' interpreter (activated or not), or a stand-in before it
    bins = [str(Path(sys.executable).parent), *([str(path)] if path is not None else [])]
    full["PATH"] = os.pathsep.join([*reversed(bins), full["PATH"]])
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def fake_gpu(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = (("python3", FAKE_PYTHON), ("nvidia-smi", FAKE_NVIDIA_SMI), ("ncu", FAKE_NCU))
    for name, text in fakes:
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_without_cuda_it_stops_at_once_with_one_line(tmp_path: Path) -> None:
    """Neither LOG_DIR nor a temporary directory is made (the check comes first: one run covers
    both ways of calling it)."""
    before = repo_state()
    temp = tmp_path / "tmp"
    temp.mkdir()
    logs = tmp_path / "logs"
    # CUDA_VISIBLE_DEVICES="" hides any GPU, so this holds on a CUDA machine too
    proc = gpu_check(str(logs), cwd=REPO, env={"CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(temp)})
    assert proc.returncode == 2, proc
    assert proc.stdout == "", proc.stdout
    assert proc.stderr.splitlines() == [
        "gpu_check.sh: no CUDA GPU (torch.cuda.is_available() is False): nothing run"
    ], proc.stderr
    assert not logs.exists() and list(temp.iterdir()) == []
    assert repo_state() == before


def test_without_omegaconf_it_stops_at_once_with_one_line(tmp_path: Path, fake_gpu: Path) -> None:
    logs = tmp_path / "logs"
    proc = gpu_check(str(logs), cwd=tmp_path, env={"NO_OMEGACONF": "1"}, path=fake_gpu)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert proc.stderr.startswith("gpu_check.sh: python3 cannot import omegaconf")
    assert len(proc.stderr.splitlines()) == 1 and not logs.exists()


@pytest.mark.parametrize("unknown", ["imm", "step"])  # "step": now train_speed's row
def test_unknown_step_is_refused(tmp_path: Path, unknown: str) -> None:
    env = {"STEPS": f"imma {unknown}", "CUDA_VISIBLE_DEVICES": ""}
    proc = gpu_check(cwd=tmp_path, env=env)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"gpu_check.sh: STEPS names no step {unknown} (steps: tests convtests imma static bench "
        "ncu train_speed train integer ddp)\n"
    )


def test_failed_steps_make_it_fail_named_with_their_exit_status(
    tmp_path: Path, fake_gpu: Path
) -> None:
    before = repo_state()
    logs = tmp_path / "logs"
    env = {"STEPS": "static integer", "STEP_TIMEOUT": "1", "INTEGER_RC": "7"}
    proc = gpu_check("logs", cwd=tmp_path, env=env, path=fake_gpu)  # relative to the caller
    assert proc.returncode == 1, proc
    lines = proc.stdout.splitlines()
    assert lines[0] == f"gpu_check.sh: logs in {logs}"
    timed_out = rf"static check: exit 124 after \d+ s \(log: {re.escape(str(logs))}/static.log\)"
    assert any(re.fullmatch(timed_out, line) for line in lines), lines
    assert lines[-1] == (
        "gpu_check.sh: 2 of 2 steps failed: static check (exit 124); integer model: CUDA kernels "
        f"vs reference (exit 7) (logs: {logs})"
    )
    assert sorted(p.name for p in logs.iterdir()) == ["gpu.txt", "integer.log", "static.log"]
    assert repo_state() == before


def test_all_steps_passed_and_no_log_dir_means_a_temporary_one(
    tmp_path: Path, fake_gpu: Path
) -> None:
    before = repo_state()
    env = {"STEPS": "integer", "INTEGER_RC": "0", "TMPDIR": str(tmp_path)}
    proc = gpu_check(cwd=REPO, env=env, path=fake_gpu)
    assert proc.returncode == 0, proc
    (logs,) = tmp_path.glob("inq-gpu-check.*")
    assert proc.stdout.splitlines()[-1] == f"gpu_check.sh: all 1 steps passed (logs: {logs})"
    assert sorted(p.name for p in logs.iterdir()) == ["gpu.txt", "integer.log"]
    assert repo_state() == before


def test_the_default_steps_put_the_benchmark_first(tmp_path: Path, fake_gpu: Path) -> None:
    """STEPS empty is the default: the benchmark, both Nsight Compute runs, the int8 and the
    conv kernel tests on the GPU, in that order (what a short lease wants most first)."""
    before = repo_state()
    logs, calls = tmp_path / "logs", tmp_path / "calls.txt"
    proc = gpu_check(str(logs), cwd=REPO, env={"STEPS": "", "CALLS": str(calls)}, path=fake_gpu)
    assert proc.returncode == 0, proc
    assert proc.stdout.splitlines()[-1] == f"gpu_check.sh: all 5 steps passed (logs: {logs})"
    ran = calls.read_text().splitlines()
    assert ran[0].startswith(f"-m inq.cli bench kernel --json {logs}/kernel_bench.json")
    assert [line.split()[0] for line in ran[1:3]] == ["ncu", "ncu"]
    assert [line.split()[:2] for line in ran[3:]] == [["-m", "pytest"]] * 2
    assert "imma" in ran[3] and "shift_conv2d" in ran[4]
    assert repo_state() == before


def test_with_the_static_check_the_benchmark_is_held_against_the_time_model(
    tmp_path: Path, fake_gpu: Path
) -> None:
    logs, calls = tmp_path / "logs", tmp_path / "calls.txt"
    env = {"STEPS": "static bench", "CALLS": str(calls)}
    proc = gpu_check(str(logs), cwd=REPO, env=env, path=fake_gpu)
    assert proc.returncode == 0, proc
    ran = calls.read_text().splitlines()
    model, integer = "experiments/model_records.py", "experiments/integer_estimate.py"
    assert [line.split()[0] for line in ran] == ["-m", "-m", model, model, integer]
    assert f"--harness clean flush --triton unknown -o {logs}/model_clean.json" in ran[2]
    assert ran[4] == f"{integer} {logs}/static.json {logs}/kernel_bench.json"


def test_the_training_speed_step_keeps_within_a_shorter_step_timeout(
    tmp_path: Path, fake_gpu: Path
) -> None:
    """Below 90 s, STEP_TIMEOUT is train_speed's limit too, and its budget 30 s less (none at
    all under 30 s); past the limit the step fails with 124."""
    calls = tmp_path / "calls.txt"
    env = {"STEPS": "train_speed", "CALLS": str(calls), "STEP_TIMEOUT": "1", "SLEEP": "30"}
    proc = gpu_check("logs", cwd=tmp_path, env=env, path=fake_gpu)
    assert proc.returncode == 1, proc
    assert proc.stdout.splitlines()[-1].startswith(
        "gpu_check.sh: 1 of 1 steps failed: training speed, with and without INQ (exit 124)"
    )
    assert calls.read_text().split()[-2:] == ["--budget-s", "0"]
    calls.unlink()
    env |= {"STEP_TIMEOUT": "45", "SLEEP": "0"}
    proc = gpu_check("logs", cwd=tmp_path, env=env, path=fake_gpu)
    assert proc.returncode == 0, proc
    assert calls.read_text().split()[-2:] == ["--budget-s", "15"]
