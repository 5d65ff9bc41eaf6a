"""Process group and device: one process, or one per GPU/CPU worker under ``torchrun``.

Masks stay identical on every rank because every rank holds the same weights (DDP broadcasts them
at start and all-reduces gradients) and the ``random`` partition is seeded by (seed, layer,
stage); :func:`check_identical` proves it at every stage boundary.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: torch.distributed.nn.functional binds
# ``group.WORLD`` as a default argument on first import, and DDP imports it (through
# torch._dynamo) when it is built. Imported after init_process_group, it would pin the group:
# destroy_process_group could not free it, and its gloo worker threads would live on into
# interpreter exit, where one that still drops a tensor is ended by CPython as it takes the
# GIL, an unwinding that aborts the process ("terminate called without an active exception").
# Imported here, it binds None.
import torch.distributed.nn
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from inq.scheduler import INQScheduler

T = TypeVar("T")

__all__ = [
    "Dist",
    "all_sum",
    "broadcast_buffers",
    "check_identical",
    "launch_command",
    "setup",
    "share",
    "teardown",
    "wrap_ddp",
]


@dataclass(frozen=True)
class Dist:
    """This process's place: ``rank`` of ``world_size``, and the device it trains on."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def main(self) -> bool:
        """True on the process that logs and writes files (rank 0)."""
        return self.rank == 0


def setup(device: str = "auto") -> Dist:
    """Join the ``torchrun`` process group if there is one (nccl on CUDA, else gloo).

    Example:
        >>> setup("cpu")
        Dist(rank=0, world_size=1, device=device(type='cpu'))
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank = dist.get_rank() if world_size > 1 else 0
    return Dist(rank=rank, world_size=world_size, device=dev)


def launch_command(world_size: int | None = None) -> str:
    """The command that starts a run of ``world_size`` processes (default: this process's run,
    read from torchrun's environment) again: ``inq-train``, or ``inq-torchrun`` with as many
    processes (per node, as this one has).

    Example:
        >>> launch_command(), launch_command(2)  # not under torchrun here
        ('inq-train', 'inq-torchrun --nproc_per_node=2')
    """
    world = world_size or int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return "inq-train"
    per_node = min(world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
    nodes = f"--nnodes={world // per_node} " if world != per_node else ""
    return f"inq-torchrun {nodes}--nproc_per_node={per_node}"


def teardown() -> None:
    """Leave the process group, all ranks together (no-op in a single process).

    Every rank waits at a barrier for the others, then frees the group (its threads joined, its
    connections closed), so no rank shuts its end while another still talks to it, and none
    exits with the group alive. Called while an exception propagates (a rank that failed or was
    stopped, whose peers may be anywhere), it leaves at once, without waiting, and frees the
    group all the same (:func:`_drop_frame_locals`).
    """
    if not dist.is_initialized():
        return
    failing = sys.exc_info()[1]
    if failing is None:
        nccl = dist.get_backend() == "nccl"
        dist.barrier(device_ids=[torch.cuda.current_device()] if nccl else None)
    else:
        _drop_frame_locals(failing)
    dist.destroy_process_group()


def _drop_frame_locals(err: BaseException) -> None:
    """Clear the locals of the finished frames that ``err``'s traceback, and those of the
    exceptions it chains, keep alive (a printed traceback needs only their code and lines).

    Those frames hold the model in DDP (inq-train's trainer), and DDP holds the process group:
    destroy_process_group would only unregister it (gloo's shutdown does nothing; its worker
    threads end with the group), and a stopped rank would take them into interpreter exit,
    where one that frees its last collective's work (whose thread-local state holds Python
    objects) asks for the GIL, and CPython ends the thread inside that destructor: "terminate
    called without an active exception", SIGABRT.
    """
    chain: list[BaseException | None] = [err]
    seen: set[int] = set()
    while chain:
        exc = chain.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)  # skips the frames still running (callers')
        chain += [exc.__cause__, exc.__context__]


def wrap_ddp(env: Dist, module: nn.Module) -> nn.Module:
    """``module`` as a training step calls it: in DDP with several processes, else itself."""
    if env.world_size == 1:
        return module
    ids = [env.device] if env.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


def all_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over ranks (identity in a single process)."""
    if dist.is_initialized():
        dist.all_reduce(values)
    return values


def share(value: T) -> T:
    """Rank 0's ``value`` on every rank (a picklable object; identity in a single process).

    Example:
        >>> share({"dir": "outputs/run"})
        {'dir': 'outputs/run'}
    """
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.no_grad()
def broadcast_buffers(model: nn.Module) -> None:
    """Copy rank 0's buffers (BatchNorm statistics) to every rank.

    DDP does this at the start of each forward, so after the last training step of an epoch
    each rank still holds statistics of its own batch; evaluation and checkpoints need rank 0's.
    """
    if dist.is_initialized():
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


def _digest(tensor: torch.Tensor) -> torch.Tensor:
    # Exact, order-sensitive checksum of the bits: any differing element changes it.
    bits = tensor.detach().flatten().contiguous()
    bits = bits.view(torch.uint8) if bits.dtype != torch.bool else bits.to(torch.uint8)
    weights = torch.arange(bits.numel(), device=bits.device) % 65521 + 1
    return (bits.to(torch.int64) * weights).sum()


@torch.no_grad()
def check_identical(model: nn.Module, scheduler: INQScheduler) -> None:
    """Raise if any rank's weights, buffers or INQ masks differ from rank 0's (bit for bit).

    Raises:
        RuntimeError: naming the first tensor that differs.
    """
    if not dist.is_initialized():
        return
    named = list(model.state_dict().items())
    named += [(f"{layer.name}.inq_mask", layer.mask) for layer in scheduler.layers]
    device = next(model.parameters()).device  # nccl needs CUDA tensors, gloo takes CPU ones
    mine = torch.stack([_digest(t) for _, t in named]).to(device)
    ref = mine.clone()
    dist.broadcast(ref, src=0)
    bad = all_sum(torch.ne(mine, ref).to(torch.int64))
    if bool(bad.any()):
        first = named[int(bad.nonzero()[0])][0]
        raise RuntimeError(f"ranks diverged: {first!r} differs from rank 0's")
