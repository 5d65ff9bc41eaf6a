"""Sweeps through the Hydra submitit launcher (the ``slurm`` extra, which ``dev`` pulls in).

``submitit_local`` runs each job of a sweep in its own process, through the same pickling and
result-collection path as ``submitit_slurm`` does on a cluster; the Slurm launcher itself needs
``sbatch``, so only its config is checked here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from train_helpers import TINY, inq_train, inq_train_here

LOCAL = ("hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5")


@pytest.mark.slow
def test_submitit_local_sweep_runs_each_job_in_its_own_process(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    inq_train(
        "-m", *LOCAL, "inq.bits=4,5", *TINY, "inq.portions=[0.5,1.0]", f"hydra.sweep.dir={sweep}"
    )
    for job, bits in (("0", 4), ("1", 5)):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["bits"] == bits
        assert list(summary["stages"]) == ["stage1", "stage2"]
        assert summary["final_acc"] == summary["stages"]["stage2"]["acc"]
        assert 0.0 <= summary["final_acc"] <= 1.0
        assert (sweep / job / "model.inq.safetensors").is_file()
    # submitit's own folder: one per job, with the job's log and pickled result
    outs = sorted((sweep / ".submitit").glob("*/*_0_log.out"))
    assert len(outs) == 2
    assert len(list((sweep / ".submitit").glob("*/*_0_result.pkl"))) == 2
    logs = "".join(out.read_text() for out in outs)
    assert "-> 4-bit INQ" in logs and "-> 5-bit INQ" in logs  # the jobs' result tables
    assert "Job completed successfully" in logs


def test_submitit_slurm_launcher_config_composes_without_a_cluster(tmp_path: Path) -> None:
    status, out, err = inq_train_here(
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.partition=gpu",
        "hydra.launcher.gpus_per_node=1",
        "hydra.launcher.timeout_min=240",
        "--cfg",
        "hydra",
        "-p",
        "hydra.launcher",
        cwd=tmp_path,
    )
    assert status == 0, err
    launcher = yaml.safe_load(out)
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert (launcher["partition"], launcher["gpus_per_node"], launcher["timeout_min"]) == (
        "gpu",
        1,
        240,
    )
    assert launcher["submitit_folder"] == "${hydra.sweep.dir}/.submitit/%j"
