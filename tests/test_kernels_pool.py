"""The integer model's pooling ops (:mod:`inq.kernels.pool`) and their Triton kernels
(:mod:`inq.kernels.triton.pool`), bit for bit.

Without a GPU the kernels run under the Triton interpreter on CPU tensors (``tests/conftest.py``
sets ``TRITON_INTERPRET=1``); shapes stay within a few tiles.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import CPU_ROUTE, route_on_cpu
from hypothesis import given, settings
from hypothesis import strategies as st

import inq.kernels  # noqa: F401  (registers torch.ops.inq.*)
from inq.kernels import pool
from inq.kernels.int8 import requantize, value_dtype
from inq.kernels.triton import pool as tp

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYOUTS = [torch.contiguous_format, torch.channels_last]
INT8 = [torch.uint8, torch.int8]
INT32 = (-(1 << 31), (1 << 31) - 1)
RANGES = [(0, 255), (-128, 127), (0, 192), INT32]  # uint8, int8, a ReLU6's range, int32
# kernel, stride, padding, dilation, ceil_mode
RESNET = ([3, 3], [2, 2], [1, 1], [1, 1], False)  # ResNet's stem: 3x3 / 2, padding 1
MAX_GEOMETRIES = [
    RESNET,
    ([2, 2], [2, 2], [0, 0], [1, 1], True),  # ceil_mode: a last window half outside the input
    ([3, 2], [2, 1], [1, 1], [1, 1], True),
    ([3, 3], [1, 2], [1, 0], [2, 2], False),  # dilation
    ([1, 1], [1, 1], [0, 0], [1, 1], False),
]


def values(shape: tuple[int, ...], dtype: torch.dtype, layout=torch.contiguous_format,
           seed: int = 0) -> torch.Tensor:  # fmt: skip
    """Random integers of ``dtype`` with its extremes (``0, 255`` or ``-128, 127``) in front."""
    info = torch.iinfo(dtype)
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(info.min, info.max + 1, shape, generator=gen, dtype=torch.int64)
    v.view(-1)[:4] = torch.tensor([info.min, info.max, info.min, info.max])[: v.numel()]
    return v.to(dtype).contiguous(memory_format=layout)


def old_maxpool(x, kernel, stride, padding, dilation, ceil_mode):
    """What the integer model ran before the op (three float32 passes)."""
    return F.max_pool2d(x.float(), kernel, stride, padding, dilation, ceil_mode).to(x.dtype)


def old_avgpool(x, kernel, stride, multiplier, shift, lo, hi):
    """What the integer model ran before the op (int64 or float64 sums, then requantize)."""
    if kernel is None:
        total = x.to(torch.int64).sum(dim=(2, 3), keepdim=True)
    else:
        total = F.avg_pool2d(x.double(), kernel, stride, divisor_override=1).to(torch.int64)
    return requantize(total, multiplier, shift, lo, hi).to(value_dtype(lo, hi))


# ---------------------------------------------------------------------------------- references


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", INT8)
def test_references_are_the_former_pytorch_passes(dtype, layout) -> None:
    """The integer model's outputs stay what they were: values, dtype and memory format."""
    x = values((2, 17, 9, 10), dtype, layout)
    for geometry in MAX_GEOMETRIES:
        want, got = old_maxpool(x, *geometry), pool.max_pool2d_int_reference(x, *geometry)
        assert torch.equal(got, want) and got.stride() == want.stride()
    for kernel, stride in ((None, None), ([2, 2], [2, 2]), ([3, 2], [1, 2])):
        for lo, hi in RANGES:
            want = old_avgpool(x, kernel, stride, 37, 9, lo, hi)
            got = pool.avg_pool2d_requant_reference(x, kernel, stride, 37, 9, lo, hi)
            assert got.dtype == want.dtype and torch.equal(got, want)
            assert got.stride() == want.stride()


def test_int32_max_pool_is_exact_beyond_float32() -> None:
    x = torch.tensor([[[[(1 << 24) + 1, 1 << 24], [-(1 << 31), (1 << 31) - 1]]]])
    got = pool.max_pool2d_int_reference(x.to(torch.int32), [1, 2], [1, 2], [0, 0], [1, 1], False)
    assert got.flatten().tolist() == [(1 << 24) + 1, (1 << 31) - 1]


def test_refusals() -> None:
    x = torch.zeros(1, 2, 5, 5, dtype=torch.uint8)
    geometry = ([3, 3], [1, 1], [1, 1], [1, 1], False)
    for bad in (x.long(), x.float(), x[0]):
        with pytest.raises(ValueError, match="uint8, int8, int16 or int32"):
            torch.ops.inq.max_pool2d_int(bad, *geometry)
    with pytest.raises(ValueError, match="padding"):
        torch.ops.inq.max_pool2d_int(x, [3, 3], [1, 1], [2, 2], [1, 1], False)
    with pytest.raises(ValueError, match="two entries"):
        torch.ops.inq.max_pool2d_int(x, [3], [1, 1], [1, 1], [1, 1], False)
    with pytest.raises(ValueError, match="no output pixel"):
        torch.ops.inq.max_pool2d_int(x, [7, 7], [1, 1], [0, 0], [1, 1], False)
    # 2 taps dilated by 3 from -1 on a 2-wide input: -1 and 2, both outside (PyTorch: -inf)
    assert F.max_pool2d(torch.zeros(1, 1, 2, 2), 2, 1, 1, 3).isinf().all()
    with pytest.raises(ValueError, match="holds no element of the input"):
        torch.ops.inq.max_pool2d_int(x[..., :2, :2], [2, 2], [1, 1], [1, 1], [3, 3], False)
    with pytest.raises(ValueError, match=r"shift must lie in 0\.\.62"):
        torch.ops.inq.avg_pool2d_requant(x, None, None, 1, 63, 0, 255)
    with pytest.raises(ValueError, match="takes no stride"):
        torch.ops.inq.avg_pool2d_requant(x, None, [1, 1], 1, 0, 0, 255)
    with pytest.raises(ValueError, match="within the input"):
        torch.ops.inq.avg_pool2d_requant(x, [6, 1], None, 1, 0, 0, 255)


def test_global_average_rounds_half_up_for_negative_sums() -> None:
    """``(total * m + 2**(s-1)) >> s``: ties go up (towards +inf), also below zero."""
    x = torch.tensor([5, -5, -3, 3, -1, 1, 0, -128], dtype=torch.int8).view(1, 8, 1, 1)
    got = torch.ops.inq.avg_pool2d_requant(x, None, None, 1, 1, -128, 127)
    assert got.flatten().tolist() == [3, -2, -1, 2, 0, 1, 0, -64]  # 2.5, -2.5, -1.5, 1.5, ...


@settings(max_examples=40)
@given(st.integers(-(1 << 20), 1 << 20), st.integers(1, (1 << 31) - 1), st.integers(0, 62))
def test_average_is_requantize_of_the_exact_sum(total: int, multiplier: int, shift: int) -> None:
    """A map whose sum is ``total``: the op is python's exact ``(t * m + half) >> s``, clamped."""
    pixels = -(-abs(total) // 127) + 1
    x = torch.zeros(pixels, dtype=torch.int64)
    x[: abs(total) // 127] = 127
    x[abs(total) // 127] = abs(total) % 127
    x = (x if total >= 0 else -x).to(torch.int8).view(1, 1, 1, pixels)
    want = min(max((total * multiplier + ((1 << shift) >> 1)) >> shift, INT32[0]), INT32[1])
    assert int(torch.ops.inq.avg_pool2d_requant(x, None, None, multiplier, shift, *INT32)) == want


# ---------------------------------------------------------------------------------- Triton


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", INT8)
@pytest.mark.parametrize("around", ["below", "above"])
def test_max_pool_kernel_is_the_reference(dtype, layout, around: str) -> None:
    """Bit for bit, with the reference's dtype and memory format: odd channel counts around
    the channel tile (tp.pool_tiles: 16 channels in NCHW, 64 in channels_last; 3, inside one
    tile, and a tile + 1: 17 or 65), the dtype's extremes, ResNet's stem, ceil_mode, dilation,
    padding."""
    channels = 3 if around == "below" else tp.pool_tiles(layout == torch.channels_last)[1] + 1
    x = values((2, channels, 7, 9), dtype, layout, seed=channels)
    low = torch.iinfo(dtype).min
    x[1, :, :3, :3] = low  # windows of the minimum only: the padding (also the minimum) ties
    for geometry in MAX_GEOMETRIES:
        want = pool.max_pool2d_int_reference(x, *geometry)
        got = tp.max_pool2d_int(x.to(DEVICE), *geometry)
        assert got.dtype == want.dtype and got.stride() == want.stride()
        assert torch.equal(got.cpu(), want), geometry


def test_padding_never_wins() -> None:
    """Padding loads the dtype's minimum; every window holds an input element (PyTorch bounds
    the padding by half the kernel, the op refuses dilated windows outside the input), so the
    minimum only comes out where the input holds it."""
    for dtype in INT8:
        low = torch.iinfo(dtype).min
        x = torch.full((1, 1, 4, 4), low + 1, dtype=dtype)
        x[0, 0, :2, :2] = low  # the input of the padded corner's window: the minimum only
        got = tp.max_pool2d_int(x.to(DEVICE), *RESNET).cpu()
        assert got.flatten().tolist() == [low] + [low + 1] * 3
        assert torch.equal(got, pool.max_pool2d_int_reference(x, *RESNET))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [*INT8, torch.int16, torch.int32])
def test_average_kernels_are_the_reference(dtype, layout) -> None:
    """Global (ResNet's AdaptiveAvgPool2d(1)) and windowed, int32 sums for 8-bit inputs and
    int64 ones for wider: multipliers up to 31 bits, shifts 0 to 62 (ties at 1/2 with shift 1),
    clamps to uint8, int8, a ReLU6's 0..192 and int32."""
    x = values((2, 17, 6, 5), dtype, layout, seed=7)
    for kernel, stride in ((None, None), ([2, 2], None), ([3, 2], [1, 2])):
        for (lo, hi), (multiplier, shift) in zip(
            RANGES, [(1, 1), (37, 12), ((1 << 31) - 1, 40), (3, 0)], strict=True
        ):
            args = (kernel, stride, multiplier, shift, lo, hi)
            want = pool.avg_pool2d_requant_reference(x, *args)
            got = tp.avg_pool2d_requant(x.to(DEVICE), *args)
            assert got.dtype == want.dtype and got.stride() == want.stride()
            assert torch.equal(got.cpu(), want), args
    assert not tp._wide(x[:, :, :1, :1].to(torch.uint8), 8421504)  # 8421504 * 255 < 2**31
    assert tp._wide(x.to(torch.uint8), 8421505) and tp._wide(x.to(torch.int32), 1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_empty_batches_and_other_layouts(layout) -> None:
    """N = 0 launches nothing; a non-dense input (a strided view) runs the reference."""
    x = values((0, 5, 6, 6), torch.uint8, layout)
    assert tp.max_pool2d_int(x.to(DEVICE), *RESNET).shape == (0, 5, 3, 3)
    assert tp.avg_pool2d_requant(x.to(DEVICE), None, None, 1, 0, 0, 255).shape == (0, 5, 1, 1)
    view = values((2, 5, 9, 9), torch.int8, layout)[:, 1:, ::2]
    assert torch.equal(tp.max_pool2d_int(view.to(DEVICE), *RESNET).cpu(),
                       pool.max_pool2d_int_reference(view, *RESNET))  # fmt: skip
    args = (None, None, 3, 2, -128, 127)
    assert torch.equal(tp.avg_pool2d_requant(view.to(DEVICE), *args).cpu(),
                       pool.avg_pool2d_requant_reference(view, *args))  # fmt: skip


@settings(max_examples=15)
@given(st.data())
def test_kernels_match_the_reference_on_random_geometry(data) -> None:
    """Hypothesis: any max-pool geometry PyTorch takes whose windows meet the input, any
    window, both layouts, both 8-bit dtypes."""
    dtype = data.draw(st.sampled_from(INT8))
    layout = data.draw(st.sampled_from(LAYOUTS))
    h, w, c = (
        data.draw(st.integers(1, 9)),
        data.draw(st.integers(1, 9)),
        data.draw(st.integers(1, 20)),
    )
    x = values(
        (data.draw(st.integers(0, 2)), c, h, w), dtype, layout, data.draw(st.integers(0, 99))
    )
    kernel = [data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))]
    stride = [data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))]
    padding = [data.draw(st.integers(0, k // 2)) for k in kernel]
    dilation = [data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))]
    geometry = (kernel, stride, padding, dilation, data.draw(st.booleans()))
    try:
        want = pool.max_pool2d_int_reference(x, *geometry)
    except ValueError:  # no output pixel, or a window outside the input: both paths refuse
        with pytest.raises(ValueError):
            tp.max_pool2d_int(x.to(DEVICE), *geometry)
    else:
        assert torch.equal(tp.max_pool2d_int(x.to(DEVICE), *geometry).cpu(), want)
    if kernel[0] <= h and kernel[1] <= w:
        args = (
            kernel,
            stride,
            data.draw(st.integers(1, 1000)),
            data.draw(st.integers(0, 20)),
            -128,
            127,
        )
        want = pool.avg_pool2d_requant_reference(x, *args)
        assert torch.equal(tp.avg_pool2d_requant(x.to(DEVICE), *args).cpu(), want)


# ---------------------------------------------------------------------------------- ops


def _register_cpu_route() -> None:
    """On CPU, a test-only kernel sends the ops to the interpreter while ``triton_ops`` is
    active and to the reference otherwise (as ``tests/test_kernels_triton.py`` does)."""
    pairs = [
        (pool.max_pool2d_int, tp.max_pool2d_int, pool.max_pool2d_int_reference),
        (pool.avg_pool2d_requant, tp.avg_pool2d_requant, pool.avg_pool2d_requant_reference),
    ]
    route_on_cpu(pairs)


if DEVICE == "cpu":
    _register_cpu_route()


@pytest.fixture(params=[False, True], ids=["reference", "triton"])
def triton_ops(request):
    """The ops with their reference, then with the Triton kernels behind them."""
    CPU_ROUTE["triton"] = request.param and DEVICE == "cpu"
    try:
        yield
    finally:
        CPU_ROUTE["triton"] = False


def test_opcheck(triton_ops) -> None:
    """Schema, fake implementation (shape, dtype, memory format) and dynamic shapes."""
    assert str(torch.ops.inq.avg_pool2d_requant.default._schema) == (
        "inq::avg_pool2d_requant(Tensor x, int[]? kernel, int[]? stride, int multiplier, "
        "int shift, int lo, int hi) -> Tensor"
    )
    for layout in LAYOUTS:
        x = values((2, 3, 7, 6), torch.int8, layout).to(DEVICE)
        torch.library.opcheck(torch.ops.inq.max_pool2d_int.default, (x, *MAX_GEOMETRIES[1]))
        for kernel, stride in ((None, None), ([2, 3], [1, 2])):
            args = (x, kernel, stride, 37, 9, 0, 255)
            torch.library.opcheck(torch.ops.inq.avg_pool2d_requant.default, args)
