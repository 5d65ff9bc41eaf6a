"""Training checkpoints: atomic writes, ``weights_only`` loads, RNG capture, resume checks.

A checkpoint is a plain dict of tensors, numbers and strings (no pickled code), written with
:func:`inq.fileio.atomic_path` so a kill at any moment leaves the previous file intact. What a
training run's checkpoint holds is :func:`training_state`; :func:`restore_training_state` puts it
back, and :func:`save_run_checkpoint` keeps a run's ``checkpoints/`` folder.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import signal
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors.torch import load_file
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from inq.distill import frozen_teacher
from inq.errors import ConfigError
from inq.fileio import atomic_path
from inq.runfiles import LATEST
from inq.scheduler import INQScheduler
from inq.train.config import Config, schema_of, to_dict
from inq.train.distributed import launch_command

__all__ = [
    "CHECKPOINT_DIR",
    "FORMAT",
    "KILL_ENV",
    "check_finite",
    "check_world_size",
    "first_non_finite",
    "get_rng_state",
    "kill_point",
    "link_checkpoint",
    "load_checkpoint",
    "load_float_weights",
    "resolve_resume",
    "restore_optimizer",
    "restore_training_state",
    "resumed_config",
    "save_checkpoint",
    "save_run_checkpoint",
    "saved_teacher",
    "set_rng_state",
    "training_state",
]

FORMAT = "inq-train/1"
CHECKPOINT_DIR = str(PurePath(LATEST).parent)  # of a run directory: latest.pt, float.pt, stageK.pt
KILL_ENV = "INQ_TRAIN_KILL_AT"
# Keys that may differ between a run and its resumption: none of them changes the weights.
RESUMABLE_CHANGES = frozenset(
    {
        "trainer.resume",
        "trainer.allow_nonempty_dir",
        "trainer.progress",
        "trainer.device",
        "trainer.eval_every",
        "trainer.checkpoint_every",
        "trainer.keep_checkpoints",
        "trainer.log_every",
        "inq.cache_values",
        "data.root",
        "data.num_workers",
        "data.eval_batch_size",
        # the integer phase comes after the weights are final: redo it with other settings
        "quant.act_bits",
        "quant.input_bits",
        "quant.calibration",
        "quant.pow2_scales",
        "quant.batches",
        "quant.epochs",
        "quant.lr",
        "quant.symmetric",
        "quant.symmetric_tolerance",
        "quant.requant_terms",
    }
)


def save_checkpoint(path: Path, state: Mapping[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temp file, fsync, rename).

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "ck.pt"
        >>> save_checkpoint(file, {"format": FORMAT, "step": 3})
        >>> load_checkpoint(file)["step"]
        3
    """
    buffer = io.BytesIO()  # torch.save reports a full disk as a RuntimeError; Python, OSError
    torch.save(dict(state), buffer)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getbuffer())


def link_checkpoint(source: Path, path: Path) -> None:
    """Make ``path`` a second name of the checkpoint file ``source`` (a hard link, replaced
    atomically; a copy where the file system has no hard links). Saving ``source`` again later
    replaces its name with a new file, so ``path`` keeps this content."""
    with atomic_path(path) as tmp:
        tmp.unlink()
        try:
            os.link(source, tmp)
        except OSError:
            shutil.copyfile(source, tmp)


def training_state(
    *,
    tb_pending: list[Any],
    model: nn.Module,
    sched: INQScheduler,
    optimizer: torch.optim.Optimizer | None,
    params: str,
    lr_schedule: LRScheduler | None,
    scaler: torch.amp.GradScaler,
    progress: Mapping[str, Any],
    history: Mapping[str, Any],
    timings: Mapping[str, float],
    world_size: int,
    config: Config,
    quant: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """What a training checkpoint holds (:data:`FORMAT`): the states of the model, INQ
    scheduler, optimizer (over ``params``: ``"all"``, ``"bias_norm"`` or ``"quant"``), LR
    schedule and grad scaler, the RNG states, where the run is and what it measured, and its
    config as JSON; ``tb_pending``: the TensorBoard events of this step
    (:meth:`inq.train.monitor.Monitor.commit`); ``quant``: inside the integer phase, the state
    of the fake-quantized model it trains.
    """
    return {
        "tb_pending": tb_pending,
        "format": FORMAT,
        "model": model.state_dict(),
        "inq": sched.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer else None,
        "params": params,
        "lr_schedule": lr_schedule.state_dict() if lr_schedule else None,
        "scaler": scaler.state_dict(),
        "progress": dict(progress),
        "history": history,
        "timings": timings,
        "rng": get_rng_state(),
        "world_size": world_size,
        "config": json.dumps(to_dict(config)),
        "quant": dict(quant) if quant is not None else None,
    }


def restore_training_state(
    saved: Mapping[str, Any],
    model: nn.Module,
    sched: INQScheduler,
    scaler: torch.amp.GradScaler,
) -> None:
    """Load :func:`training_state` output into the model, INQ scheduler and grad scaler, and
    set the RNGs (last: after everything a resume builds). :func:`restore_optimizer` does the
    optimizer."""
    model.load_state_dict(saved["model"])
    sched.load_state_dict(saved["inq"])
    scaler.load_state_dict(saved["scaler"])
    set_rng_state(saved["rng"])


def restore_optimizer(
    saved: Mapping[str, Any], optimizer: torch.optim.Optimizer, lr_schedule: LRScheduler | None
) -> None:
    """Load the saved optimizer state and, unless ``lr_schedule`` is None, the LR schedule's.

    Build both first, the schedule before the optimizer state is loaded: LambdaLR's
    constructor sets the lr, which the saved optimizer state then sets back.
    """
    optimizer.load_state_dict(saved["optimizer"])
    if lr_schedule is not None:
        lr_schedule.load_state_dict(saved["lr_schedule"])


def check_world_size(saved: Mapping[str, Any], world_size: int, run_dir: Path) -> None:
    """Refuse a checkpoint saved by another number of processes than ``world_size``.

    Raises:
        ConfigError: naming ``trainer.resume`` and the command that resumes it.
    """
    world = saved["world_size"]
    if world != world_size:
        raise ConfigError(
            "trainer.resume",
            f"saved by {world} processes, not {world_size}: resume it with "
            f"{launch_command(world)} trainer.resume={run_dir}",
        )


def saved_teacher(model: nn.Module, run_dir: Path, resume: str | None, main: bool) -> nn.Module:
    """The distillation teacher of a resumed run: the float model that ``checkpoints/float.pt``
    holds, in the run directory or, for a run resumed from a checkpoint file elsewhere
    (``resume``), beside that file (then linked into this run's by rank 0 (``main``), so that
    it resumes too).

    Raises:
        ConfigError: naming ``trainer.resume`` if there is no such file.
    """
    here = run_dir / CHECKPOINT_DIR / "float.pt"
    path = here
    if not here.is_file() and resume:
        path = resolve_resume(resume).parent / here.name
    if not path.is_file():
        raise ConfigError(
            "trainer.resume",
            f"distillation (inq.distill.weight > 0) needs the run's float model, {here}, "
            "which is missing",
        )
    teacher = frozen_teacher(model)
    teacher.load_state_dict(load_checkpoint(path)["model"])
    if path != here and main:
        link_checkpoint(path, here)
    return teacher


def save_run_checkpoint(
    run_dir: Path,
    state: Mapping[str, Any],
    names: Sequence[str] = (),
    stale: Sequence[str] = (),
) -> None:
    """Write ``state`` as the run's :data:`~inq.runfiles.LATEST` checkpoint, also named
    ``<name>.pt`` for each of ``names``, and delete the ``<name>.pt`` of each of ``stale``.

    Example:
        >>> import tempfile
        >>> run_dir = Path(tempfile.mkdtemp())
        >>> save_run_checkpoint(run_dir, {"format": FORMAT}, names=["stage1"])
        >>> save_run_checkpoint(run_dir, {"format": FORMAT}, names=["stage2"], stale=["stage1"])
        >>> sorted(p.name for p in (run_dir / CHECKPOINT_DIR).iterdir())
        ['latest.pt', 'stage2.pt']
    """
    latest = run_dir / LATEST
    save_checkpoint(latest, state)
    for name in names:
        link_checkpoint(latest, latest.parent / f"{name}.pt")
    for name in stale:
        (latest.parent / f"{name}.pt").unlink(missing_ok=True)


def load_checkpoint(path: Path, key: str = "trainer.resume") -> dict[str, Any]:
    """Load a file written by :func:`save_checkpoint` with ``weights_only=True`` on the CPU.

    Raises:
        ConfigError: naming ``key`` if the file is missing, unreadable or not an inq-train one.
    """
    state = _torch_load(path, key)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(key, f"{path} is not an inq-train checkpoint")
    check_finite(state.get("model", {}), key, path)
    return state


def check_finite(state: Mapping[str, Any], key: str, path: Path) -> None:
    """Refuse a state dict holding NaN or infinite values, naming the first such tensor.

    Example:
        >>> check_finite({"w": torch.tensor([1.0, float("nan")])}, "model.checkpoint", Path("x"))
        Traceback (most recent call last):
        ...
        inq.errors.ConfigError: model.checkpoint: x holds NaN or infinite values in 'w'
    """
    for name, value in state.items():
        finite = not isinstance(value, torch.Tensor) or bool(torch.isfinite(value).all())
        if not finite:
            raise ConfigError(key, f"{path} holds NaN or infinite values in {name!r}")


def resolve_resume(resume: str) -> Path:
    """The checkpoint file that ``trainer.resume`` names: a file, or a run dir's latest one.

    Raises:
        ConfigError: if neither exists.
    """
    path = Path(resume).expanduser()
    if path.is_dir():
        path = path / LATEST
    if not path.is_file():
        raise ConfigError(
            "trainer.resume", f"no checkpoint at {path}; give a run dir or a .pt file"
        )
    return path


def resumed_config(
    recorded: Mapping[str, Any], current: DictConfig, given: Collection[str] | None = None
) -> tuple[DictConfig, dict[str, tuple[Any, Any]]]:
    """The config a resumed run goes on with: the one the run recorded, with the settings given
    now that may change (:data:`RESUMABLE_CHANGES`); returns it and ``{key: (old, new)}``.

    ``given`` names what the user set on the command line (dotted keys, or config groups such as
    ``inq``, which stand for every key under them); every other key keeps its recorded value.
    ``None`` counts every key of ``current`` as given (a caller that builds the whole config). A
    key the recording lacks (it was made before the key existed) counts as its default.

    Example:
        >>> from inq.train.config import SGDConfig
        >>> current = OmegaConf.merge(OmegaConf.structured(Config), {"optim": SGDConfig()})
        >>> current.inq.epochs, current.trainer.log_every = 6, 1  # 6: the default
        >>> recorded = {"inq": {"epochs": 2}, "optim": to_dict(SGDConfig())}
        >>> cfg, changes = resumed_config(recorded, current, given=["trainer.log_every"])
        >>> cfg.inq.epochs, changes
        (2, {'trainer.log_every': (10, 1)})
        >>> resumed_config(recorded, current, given=["inq.epochs"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        inq.errors.ConfigError: trainer.resume: ... inq.epochs=2 (given 6); ...

    Raises:
        ConfigError: naming every given key that would change the weights.
    """
    old, new = _flatten(recorded), _flatten(to_dict(current))
    defaults = _flatten(to_dict(OmegaConf.structured(Config)))

    def is_given(key: str) -> bool:
        return given is None or any(key == g or key.startswith(f"{g}.") for g in given)

    changes, refused = {}, []
    for key in sorted(new):
        before = old.get(key, defaults.get(key))
        if not is_given(key) or before == new[key]:
            continue
        if key in RESUMABLE_CHANGES:
            changes[key] = (before, new[key])
        else:
            refused.append(f"{key}={before!r} (given {new[key]!r})")
    if refused:
        raise ConfigError(
            "trainer.resume",
            "these settings shape the weights and cannot change when a run resumes: "
            + ", ".join(refused)
            + "; leave them out to continue with the run's own, or start a new run",
        )
    try:
        cfg = OmegaConf.merge(schema_of(recorded), recorded)
        for key, (_, value) in changes.items():
            OmegaConf.update(cfg, key, value)
    except OmegaConfBaseException as err:
        raise ConfigError(
            "trainer.resume", f"the run's recorded config does not fit: {str(err).splitlines()[0]}"
        ) from None
    return cfg, changes


def get_rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and python RNG states as tensors and numbers."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
        "numpy_gauss": (int(np_state[3]), float(np_state[4])),
        "python": torch.tensor(py_state[1], dtype=torch.int64),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore :func:`get_rng_state` output."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    keys = state["numpy"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, state["numpy_pos"], *state["numpy_gauss"]))
    random.setstate((3, tuple(int(v) for v in state["python"]), None))


def load_float_weights(model: nn.Module, path: str) -> None:
    """Load ``model.checkpoint`` into ``model``: a state_dict ``.pt``/``.pth``, a ``.safetensors``
    file, or an inq-train checkpoint (its ``model`` entry).

    Raises:
        ConfigError: naming ``model.checkpoint`` if the file is missing, unreadable or does not
            fit the model.
    """
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError("model.checkpoint", f"{file} is a directory; name the weights file")
    if not file.is_file():
        raise ConfigError("model.checkpoint", f"{file} does not exist")
    if file.suffix == ".safetensors":
        try:
            state = load_file(file)
        except Exception as err:  # any parse failure of a user's file is the same user error
            raise ConfigError("model.checkpoint", f"cannot read {file} ({err})") from err
    else:
        state = _torch_load(file, "model.checkpoint")
    if isinstance(state, dict) and state.get("format") == FORMAT:
        state = state["model"]
    if not isinstance(state, dict):
        raise ConfigError("model.checkpoint", f"{file} holds no state_dict")
    check_finite(state, "model.checkpoint", file)
    try:
        model.load_state_dict(state)
    except RuntimeError:
        raise ConfigError(
            "model.checkpoint", f"{file} does not fit the model: {_misfit(model, state)}"
        ) from None


def _misfit(model: nn.Module, state: Mapping[str, Any], shown: int = 3) -> str:
    """How ``state`` fails to fit ``model``, in one line: counts and the first few names.

    Example (``...`` ends the line: ``(3, 2))``):
        >>> state = {"weight": torch.zeros(3, 4), "step": torch.ones(1)}
        >>> _misfit(nn.Linear(2, 3), state)  # doctest: +ELLIPSIS
        "1 missing ('bias'), 1 unexpected ('step'), 1 of another shape ('weight': (3, 4), not ..."
    """
    mine = model.state_dict()
    missing = [k for k in mine if k not in state]
    unexpected = [k for k in state if k not in mine]
    shapes = [
        f"{k!r}: {tuple(state[k].shape)}, not {tuple(mine[k].shape)}"
        for k in mine
        if k in state and isinstance(state[k], torch.Tensor) and state[k].shape != mine[k].shape
    ]
    parts = []
    for what, items in (("missing", missing), ("unexpected", unexpected)):
        if items:
            more = ", ..." if len(items) > shown else ""
            parts.append(f"{len(items)} {what} ({', '.join(map(repr, items[:shown]))}{more})")
    if shapes:
        more = ", ..." if len(shapes) > shown else ""
        parts.append(f"{len(shapes)} of another shape ({', '.join(shapes[:shown])}{more})")
    return ", ".join(parts)


def kill_point(event: str, count: int) -> None:
    """Test seam: SIGKILL this process at the ``count``-th ``event`` if ``INQ_TRAIN_KILL_AT`` is
    ``"<event>:<count>"`` (events: ``step``, ``eval``, ``stage``, ``prune``: round k done (k),
    ``quant``: calibration done (1), fine-tuning epoch k done (k + 1)); SIGTERM where it is
    ``"<event>:<count>:TERM"``. Used to test exact resume."""
    wanted = os.environ.get(KILL_ENV, "")
    if wanted in (f"{event}:{count}", f"{event}:{count}:TERM"):
        os.kill(os.getpid(), signal.SIGTERM if wanted.endswith(":TERM") else signal.SIGKILL)


def _torch_load(path: Path, key: str) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; any failure is one :class:`ConfigError`
    (never PyTorch's advice to load with ``weights_only=False``: that would run the file's code).
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as err:
        raise ConfigError(key, f"cannot read {path}: {err.strerror or err}") from None
    except Exception:  # any parse failure of a user's file is the same user error
        raise ConfigError(
            key, f"cannot read checkpoint {path}: not a file written by torch.save, or damaged"
        ) from None


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def first_non_finite(model: nn.Module) -> str | None:
    """What is not finite in ``model`` (a weight, or a norm layer's running statistics), if any.

    Example:
        >>> bn = nn.BatchNorm1d(2)
        >>> first_non_finite(bn), bn.running_var.fill_(float("inf")) is not None
        (None, True)
        >>> first_non_finite(bn)
        "'running_var' holds NaN or infinite values"
    """
    for name, value in model.state_dict().items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return f"{name!r} holds NaN or infinite values"
    return None
