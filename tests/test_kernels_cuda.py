"""The CUDA kernels against exact references (needs a GPU; ``pytest -m cuda``).

Float ops are compared with a float64 reference on the exact weights. The tolerance is the
standard bound for a sum of K products accumulated in fp32, plus one rounding to the output
dtype, plus (fp16 only) the levels below 2**-24 that the decoded-weight paths flush like the
reference does:

    |y - ref| <= 2 * (K + 2) * 2**-24 * (|x| @ |W|.T) + u_dtype * |ref| + 2**-24 * sum|x| + tiny

The int8 op must be bit-exact against its integer reference.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from inq.packed import decode_weight, pack_codes

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

_UNIT = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
_DTYPES = list(_UNIT)


@pytest.fixture(scope="module", autouse=True)
def kernels():
    """Build (or load) the extension once (a build failure fails every test here), and keep
    cuBLAS / cuDNN, which the large-batch paths call, at full fp32 accumulation."""
    import inq.kernels  # noqa: F401  (imports inq.kernels.cuda when a GPU is present)
    from inq.kernels.build import build

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
        cudnn.allow_tf32,
    )
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    cudnn.allow_tf32 = False
    yield build()
    (
        matmul.allow_fp16_reduced_precision_reduction,
        matmul.allow_bf16_reduced_precision_reduction,
        cudnn.allow_tf32,
    ) = saved


def random_codes(o: int, k: int, bits: int, gen: torch.Generator) -> torch.Tensor:
    """Valid codes with about 20 % zeros."""
    top = 1 << (bits - 1)
    codes = torch.randint(top, 2 * top, (o, k), generator=gen, dtype=torch.int64)
    codes[torch.rand(o, k, generator=gen) < 0.2] = 0
    return codes.to(torch.uint8)


def assert_close_fp32_sum(
    y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor, k: int, abs_prod
) -> None:
    """``abs_prod(|x|, |w|)`` is the reference op applied to magnitudes (float64)."""
    bound = 2 * (k + 2) * 2.0**-24 * abs_prod(x.abs(), w.abs()) + _UNIT[y.dtype] * ref.abs() + 1e-30
    if y.dtype == torch.float16:
        bound = bound + 2.0**-24 * abs_prod(x.abs(), torch.ones_like(w))
    err = (y.double().cpu() - ref).abs()
    worst = (err / bound).max().item() if err.numel() else 0.0
    assert worst <= 1.0, f"error {worst:.3g} x the fp32-accumulation bound"


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` whose data starts one element past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


LINEAR_CASES = [
    # (out, in, batch); odd sizes do not divide the 16-row / 128-k tiles
    (64, 128, 1),
    (4096 // 8, 4096 // 4, 1),
    (33, 100, 1),
    (17, 7, 3),
    (130, 257, 8),
    (7, 1, 5),
    (96, 384, 16),
    (65, 1000, 17),
    (128, 256, 32),
    (40, 130, 33),
    (50, 300, 300),
]


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize(("o", "k", "batch"), LINEAR_CASES)
def test_shift_linear_matches_reference(o: int, k: int, batch: int, dtype, bits: int) -> None:
    gen = torch.Generator().manual_seed(o * 1000 + k + batch + bits)
    n1 = -1
    codes = random_codes(o, k, bits, gen)
    packed = pack_codes(codes, bits)
    w = decode_weight(packed, bits, n1, (o, k), torch.float64)
    x = torch.randn(batch, k, generator=gen).to(dtype)
    bias = torch.randn(o, generator=gen).to(dtype) if batch % 2 else None
    y = torch.ops.inq.shift_linear(x.cuda(), packed.cuda(), bits, n1, k, _cuda(bias))
    assert y.dtype == dtype and y.shape == (batch, o)
    ref = x.double() @ w.T + (0 if bias is None else bias.double())
    assert_close_fp32_sum(y, x.double(), w, ref, k, lambda a, b: a @ b.T)


@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
def test_shift_linear_odd_layouts(dtype, bits: int) -> None:
    """Non-contiguous x, 3-d x, misaligned packed rows and activations, float32 bias."""
    gen = torch.Generator().manual_seed(bits)
    o, k, n1 = 48, 200, 2
    packed = pack_codes(random_codes(o, k, bits, gen), bits)
    w = decode_weight(packed, bits, n1, (o, k), torch.float64)
    base = torch.randn(3, 5, 2 * k, generator=gen).to(dtype)
    x = base[..., ::2]  # stride 2 along k
    bias = torch.randn(o, generator=gen)  # float32: the op casts it like the reference
    ref = x.double() @ w.T + bias.to(dtype).double()
    for xs, ps in ((x.cuda(), packed.cuda()), (misaligned(x.cuda()), misaligned(packed.cuda()))):
        y = torch.ops.inq.shift_linear(xs, ps, bits, n1, k, bias.cuda())
        assert y.shape == (3, 5, o)
        assert_close_fp32_sum(y, x.double(), w, ref, k, lambda a, b: a @ b.T)


CONV_CASES = [
    # (N, Cin, H, W, Cout, kh, kw, stride, padding, dilation, groups)
    (2, 3, 9, 11, 8, 3, 3, 1, 1, 1, 1),
    (1, 16, 14, 14, 32, 3, 3, 2, 1, 1, 1),
    (3, 8, 10, 7, 12, 1, 1, 1, 0, 1, 4),
    (2, 6, 12, 12, 6, 3, 3, 1, 2, 2, 6),  # depthwise, dilated
    (1, 5, 8, 9, 10, 5, 3, (2, 1), (2, 0), 1, 5),  # depthwise, channel multiplier 2
    (4, 12, 7, 7, 12, 7, 7, 1, 3, 1, 12),  # depthwise 7x7
    (2, 4, 13, 13, 6, 2, 4, (1, 3), (1, 2), (2, 1), 2),
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bits", [3, 4, 6])
@pytest.mark.parametrize("dtype", _DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_shift_conv2d_matches_reference(case, dtype, bits: int, channels_last: bool) -> None:
    n, cin, h, wd, cout, kh, kw, stride, padding, dilation, groups = case
    gen = torch.Generator().manual_seed(hash(case) % 1000 + bits)
    shape = [cout, cin // groups, kh, kw]
    n1 = 0
    packed = pack_codes(random_codes(cout, math.prod(shape[1:]), bits, gen), bits)
    w = decode_weight(packed, bits, n1, tuple(shape), torch.float64)
    x = torch.randn(n, cin, h, wd, generator=gen).to(dtype)
    bias = torch.randn(cout, generator=gen).to(dtype)
    args = (_pair(stride), _pair(padding), _pair(dilation), groups)
    xc = x.cuda().to(memory_format=torch.channels_last) if channels_last else x.cuda()
    y = torch.ops.inq.shift_conv2d(xc, packed.cuda(), bits, n1, shape, bias.cuda(), *args)

    def conv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.conv2d(a, b, None, *args)

    ref = conv(x.double(), w) + bias.double()[:, None, None]
    assert y.shape == ref.shape and y.is_contiguous()
    assert_close_fp32_sum(y, x.double(), w, ref, math.prod(shape[1:]), conv)


def test_shift_conv2d_unbatched() -> None:
    gen = torch.Generator().manual_seed(0)
    packed = pack_codes(random_codes(4, 9, 4, gen), 4)
    x = torch.randn(4, 6, 6, generator=gen)
    shape, args = [4, 1, 3, 3], ([1, 1], [1, 1], [1, 1], 4)
    y = torch.ops.inq.shift_conv2d(x.cuda(), packed.cuda(), 4, 0, shape, None, *args)
    ref = torch.ops.inq.shift_conv2d(x, packed, 4, 0, shape, None, *args)
    torch.testing.assert_close(y.cpu(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize(("o", "k", "batch"), [(1, 1, 1), (33, 100, 3), (64, 4096, 2)])
def test_int8_bit_exact(o: int, k: int, batch: int, bits: int) -> None:
    from inq.kernels.int8 import exact_frac_bits, max_frac_bits, shift_linear_int8_reference

    gen = torch.Generator().manual_seed(o + k + bits)
    packed = pack_codes(random_codes(o, k, bits, gen), bits)
    x = torch.randint(-128, 128, (batch, k), generator=gen, dtype=torch.int8)
    for frac in sorted({0, min(exact_frac_bits(bits), max_frac_bits(k)), max_frac_bits(k)}):
        y = torch.ops.inq.shift_linear_int8(x.cuda(), packed.cuda(), bits, k, frac)
        assert y.dtype == torch.int32
        assert torch.equal(y.cpu(), shift_linear_int8_reference(x, packed, bits, k, frac))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", _DTYPES)
def test_converted_digits_model_predicts_like_reference(tmp_path: Path, dtype) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from export_fixtures import DIGITS_DATA, digits_run

    from inq.nn import from_packed
    from inq.packed import export_packed
    from inq.train.data import build_datasets

    path, _ = digits_run(tmp_path)
    export_packed(path, tmp_path / "digits.inq.safetensors")
    model = from_packed(tmp_path / "digits.inq.safetensors")
    x, _ = build_datasets(DIGITS_DATA)[1].tensors
    with torch.no_grad():
        ref = model(x).double()  # reference ops, float32 on the CPU
        out = model.to("cuda", dtype)(x.to("cuda", dtype)).double().cpu()
    top2 = ref.topk(2, dim=1).values
    # a class whose logit is within dtype rounding of the runner-up may flip: not compared
    clear = (top2[:, 0] - top2[:, 1]) > 64 * _UNIT[dtype] * top2[:, 0].abs()
    assert clear.float().mean() > 0.9
    assert torch.equal(out.argmax(1)[clear], ref.argmax(1)[clear])


def _pair(v: int | tuple[int, int]) -> list[int]:
    return [v, v] if isinstance(v, int) else list(v)


def _cuda(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.cuda()
