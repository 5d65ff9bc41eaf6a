"""Inference modules that hold packed power-of-two codes instead of float weights.

:class:`ShiftLinear` and :class:`ShiftConv2d` keep each weight as its packed codes (see
:mod:`inq.packed`; 4 or 8 bits a weight) and compute through the ops ``inq::shift_linear`` and
``inq::shift_conv2d`` (:mod:`inq.kernels`): a pure-PyTorch reference on any device, a CUDA kernel
where one is registered. :func:`from_packed` rebuilds a whole model from a packed file.

Example:
    >>> from torch import nn
    >>> from inq.pow2 import pow2_quantize
    >>> fc = nn.Linear(6, 3)
    >>> with torch.no_grad():
    ...     _ = fc.weight.copy_(pow2_quantize(fc.weight, n1=-1, bits=5))
    >>> shift = ShiftLinear.from_float(fc, n1=-1, bits=5)
    >>> x = torch.randn(2, 6)
    >>> torch.equal(shift(x), fc(x))
    True
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

import inq.kernels  # noqa: F401  (registers torch.ops.inq.*)
from inq.codes import decode_weight, pack_codes
from inq.kernels.ops import effective_n1
from inq.levels import describe_n1
from inq.models import build_model
from inq.packed import PackedFile, PackedLayer, load_packed
from inq.pow2 import N1, pow2_encode

__all__ = ["ShiftConv2d", "ShiftLinear", "convert_model", "from_packed"]


class _Shift(nn.Module):
    """Shared state: packed codes ``[O, row_bytes]``, bits, the level sets, the weight's shape, a
    bias. One level set: ``n1`` (int) and ``n1_rows`` None; one per output channel (``n1`` given
    as a tensor ``[O]``): ``n1 = 0`` and the buffer ``n1_rows`` (int32 ``[O]``), as the ops take
    them."""

    packed: torch.Tensor
    bias: torch.Tensor | None
    n1_rows: torch.Tensor | None

    def __init__(
        self,
        packed: torch.Tensor,
        bits: int,
        n1: N1,
        shape: tuple[int, ...],
        bias: torch.Tensor | None,
    ) -> None:
        super().__init__()
        self.bits, self.weight_shape = bits, tuple(shape)
        self.n1 = n1 if isinstance(n1, int) else 0
        rows = None if isinstance(n1, int) else n1.to(packed.device, torch.int32, copy=True)
        self.register_buffer("packed", packed)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.register_buffer("n1_rows", rows)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The float weight the codes stand for (exact)."""
        return decode_weight(self.packed, self.bits, self.effective_n1, self.weight_shape, dtype)

    @property
    def effective_n1(self) -> N1:
        """n1 as :mod:`inq.pow2` takes it: an int, or int32 ``[O]`` per output channel
        (:func:`inq.kernels.ops.effective_n1` of the layer's ``n1`` and ``n1_rows``)."""
        return effective_n1(self.n1, self.n1_rows)

    @staticmethod
    def _pack(weight: torch.Tensor, n1: N1, bits: int) -> torch.Tensor:
        return pack_codes(pow2_encode(weight.detach(), n1, bits), bits)


class ShiftLinear(_Shift):
    """``nn.Linear`` with a power-of-two weight held as packed codes.

    Build one with :meth:`from_float` or :meth:`from_packed`; see the module example.
    """

    def __init__(
        self,
        packed: torch.Tensor,
        bits: int,
        n1: N1,
        in_features: int,
        bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__(packed, bits, n1, (packed.shape[0], in_features), bias)
        self.in_features, self.out_features = in_features, packed.shape[0]

    @classmethod
    def from_float(cls, module: nn.Linear, n1: N1, bits: int) -> ShiftLinear:
        """Pack a linear layer whose weight already lies in the level set of ``(n1, bits)``
        (``n1`` an int, or a tensor ``[out_features]``: one level set per output channel).

        Raises:
            ValueError: if a weight is off the level set.
        """
        packed = cls._pack(module.weight, n1, bits)
        return cls(packed, bits, n1, module.in_features, module.bias)

    @classmethod
    def from_packed(cls, layer: PackedLayer, bias: torch.Tensor | None = None) -> ShiftLinear:
        """A module for one layer of a packed file."""
        return cls(layer.packed, layer.bits, layer.n1, layer.shape[1], bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.inq.shift_linear(
            x, self.packed, self.bits, self.n1, self.in_features, self.bias, self.n1_rows
        )

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bits={self.bits}, n1={describe_n1(self.effective_n1)}, bias={self.bias is not None}"
        )


class ShiftConv2d(_Shift):
    """``nn.Conv2d`` (stride, padding, dilation, groups, padding modes) with packed codes.

    Example:
        >>> from inq.pow2 import pow2_quantize
        >>> conv = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        >>> with torch.no_grad():
        ...     _ = conv.weight.copy_(pow2_quantize(conv.weight, n1=-1, bits=4))
        >>> x = torch.randn(1, 4, 5, 5)
        >>> torch.equal(ShiftConv2d.from_float(conv, n1=-1, bits=4)(x), conv(x))
        True
    """

    def __init__(
        self,
        packed: torch.Tensor,
        bits: int,
        n1: N1,
        weight_shape: tuple[int, int, int, int],
        bias: torch.Tensor | None = None,
        stride: tuple[int, int] = (1, 1),
        padding: tuple[int, int] = (0, 0),
        dilation: tuple[int, int] = (1, 1),
        groups: int = 1,
        pre_pad: tuple[tuple[int, ...], str] | None = None,
    ) -> None:
        super().__init__(packed, bits, n1, weight_shape, bias)
        self.stride, self.padding, self.dilation = list(stride), list(padding), list(dilation)
        self.groups = groups
        self.pre_pad = pre_pad  # (F.pad widths, mode) applied before the op, or None

    @classmethod
    def from_float(cls, module: nn.Conv2d, n1: N1, bits: int) -> ShiftConv2d:
        """Pack a conv layer whose weight already lies in the level set of ``(n1, bits)``
        (``n1`` an int, or a tensor ``[out_channels]``: one level set per output channel).

        Raises:
            ValueError: if a weight is off the level set.
        """
        return cls._like(module, cls._pack(module.weight, n1, bits), n1, bits)

    @classmethod
    def from_packed(cls, layer: PackedLayer, module: nn.Conv2d) -> ShiftConv2d:
        """A module for one layer of a packed file, with ``module``'s geometry and bias."""
        return cls._like(module, layer.packed, layer.n1, layer.bits)

    @classmethod
    def _like(cls, module: nn.Conv2d, packed: torch.Tensor, n1: N1, bits: int) -> ShiftConv2d:
        padding, pre_pad = module.padding, None
        if module.padding_mode != "zeros" or isinstance(padding, str):
            # what nn.Conv2d does: pad first ("same" may be asymmetric), then convolve unpadded
            mode = "constant" if module.padding_mode == "zeros" else module.padding_mode
            padding, pre_pad = (0, 0), (tuple(module._reversed_padding_repeated_twice), mode)
        return cls(
            packed,
            bits,
            n1,
            tuple(module.weight.shape),
            module.bias,
            module.stride,
            padding,
            module.dilation,
            module.groups,
            pre_pad,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_pad is not None:
            x = F.pad(x, self.pre_pad[0], mode=self.pre_pad[1])
        return torch.ops.inq.shift_conv2d(
            x,
            self.packed,
            self.bits,
            self.n1,
            list(self.weight_shape),
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self.n1_rows,
        )

    def extra_repr(self) -> str:
        o, i, kh, kw = self.weight_shape
        pad = f"pre_pad={self.pre_pad}" if self.pre_pad else f"padding={tuple(self.padding)}"
        return (
            f"{i * self.groups}, {o}, kernel_size=({kh}, {kw}), stride={tuple(self.stride)}, "
            f"{pad}, dilation={tuple(self.dilation)}, groups={self.groups}, bits={self.bits}, "
            f"n1={describe_n1(self.effective_n1)}, bias={self.bias is not None}"
        )


def convert_model(model: nn.Module, packed: PackedFile) -> nn.Module:
    """Load a packed file's state into ``model`` and swap its quantized layers for shift modules.

    ``nn.Linear`` and ``nn.Conv2d`` layers become :class:`ShiftLinear` / :class:`ShiftConv2d`
    holding the packed codes; other quantized layers (Conv1d/3d, transposed convs) keep float
    weights, decoded exactly. Returns the converted model (a new object only when ``model``
    itself is the quantized layer).

    Raises:
        ValueError: if the file's tensors do not match the model's state (keys or shapes).
    """
    packed.load_into(model)
    for layer in packed.layers.values():
        module = model.get_submodule(layer.module)
        if type(module) is nn.Linear:
            new: nn.Module = ShiftLinear.from_packed(layer, module.bias)
        elif type(module) is nn.Conv2d:
            new = ShiftConv2d.from_packed(layer, module)
        else:
            continue
        if not layer.module:
            return new
        parent, _, name = layer.module.rpartition(".")
        setattr(model.get_submodule(parent), name, new)
    return model


def from_packed(
    source: PackedFile | str | os.PathLike[str], model: nn.Module | None = None
) -> nn.Module:
    """The converted model of a packed file, in eval mode; built from its metadata by default.

    Without ``model``, the architecture comes from :func:`inq.models.build_model` applied
    to the file's ``model`` description (what the training app records).

    Raises:
        ValueError: if the file is unreadable or invalid, or does not match the model.
    """
    packed = source if isinstance(source, PackedFile) else load_packed(source)
    if model is None:
        if not packed.model.get("name"):
            raise ValueError(
                "the packed file names no model (empty 'model' metadata); build the model "
                "yourself and call inq.nn.from_packed(path, model)"
            )
        model = build_model(packed.model)
    return convert_model(model, packed).eval()
