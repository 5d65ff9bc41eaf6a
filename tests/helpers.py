"""Helpers shared by the test modules: random valid codes, model files edited after they were
written (tampered with, or re-signed), and a model that cannot be differentiated twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from inq.fileio import read_safetensors, write_safetensors

TensorEdit = Callable[[dict[str, torch.Tensor]], object]
MetadataEdit = Callable[[dict[str, str]], object]


class _Once(torch.autograd.Function):
    """The identity, as an op whose derivative has no derivative of its own."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():  # a backward that builds a graph: create_graph=True
            raise RuntimeError("the derivative of _Once has no derivative")
        return grad


class BackpropOnce(nn.Module):
    """``model``, its output through :class:`_Once`: trainable, but a second derivative (a
    Hessian-vector product) raises."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Once.apply(self.model(x))


def random_codes(
    o: int, k: int, bits: int, seed: int | torch.Generator, zeros: float = 0.2
) -> torch.Tensor:
    """Valid ``bits``-bit codes ``uint8 [o, k]``, about ``zeros`` of them the zero code, drawn
    from ``seed`` (a number, or a generator that goes on from where it is)."""
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(seed)
    top = 1 << (bits - 1)
    codes = torch.randint(top, 2 * top, (o, k), generator=gen)
    codes[torch.rand(o, k, generator=gen) < zeros] = 0
    return codes.to(torch.uint8)


def rewritten(
    src: Path,
    dst: Path,
    edit_tensors: TensorEdit | None = None,
    edit_meta: MetadataEdit | None = None,
    *,
    resign: bool = False,
) -> Path:
    """``src`` with the edits applied, written to ``dst``: keeping the digest ``src`` carries (a
    file changed after it was written, which every reader must refuse), or with ``resign`` a
    digest recomputed over the edited contents (as a tool that edits files could)."""
    if resign:
        tensors, metadata = read_safetensors(src)
        tensors = {k: v.clone() for k, v in tensors.items()}
    else:
        tensors = load_file(src)
        with safe_open(src, "pt") as f:
            metadata = f.metadata()
    if edit_tensors:
        edit_tensors(tensors)
    if edit_meta:
        edit_meta(metadata)
    if resign:
        write_safetensors(dst, tensors, metadata)
    else:
        save_file(tensors, dst, metadata=metadata)
    return dst


# whether the ops' test-only CPU kernels (route_on_cpu) run the Triton kernels (the interpreter)
CPU_ROUTE = {"triton": False}


def route_on_cpu(pairs: list[tuple[object, Callable[..., object], Callable[..., object]]]) -> None:
    """For each ``(op, kernel, reference)`` of a custom op, register a CPU kernel that runs
    ``kernel`` while ``CPU_ROUTE["triton"]`` is set and ``reference`` otherwise."""
    for op, kernel, reference in pairs:

        def route(*args, kernel=kernel, reference=reference):
            return (kernel if CPU_ROUTE["triton"] else reference)(*args)

        op.register_kernel("cpu")(route)


def residual_net(bits: int) -> nn.Module:
    """A small ResNet (eval, ``bits``-bit power-of-two weights): a stem, a basic block whose
    skip is the block's input and one whose skip is a strided 1x1 convolution, then pooling
    and a classifier. Its integer model has both kinds of residual add."""
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    down = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        BasicBlock(16, 16), BasicBlock(16, 32, stride=2, downsample=down),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 5),
    ).eval()  # fmt: skip
    return pow2_weights(net, bits)


def pow2_weights(net: nn.Module, bits: int) -> nn.Module:
    """``net`` with every Conv2d and Linear weight power-of-two quantized to ``bits``, in
    place."""
    from inq.pow2 import pow2_n1, pow2_quantize

    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                m.weight.copy_(pow2_quantize(m.weight, pow2_n1(m.weight), bits))
    return net
