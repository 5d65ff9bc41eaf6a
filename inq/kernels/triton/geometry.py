"""Index math the convolution kernels share: which output pixels and channels a program
owns, and where their receptive fields start; and the longest serial K loop a CTA may run."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["MAX_STEPS", "conv_tile", "k_splits", "pixel_origins"]

MAX_STEPS = 32  # serial K steps (or chunks) a CTA runs at most: split-K beyond


@triton.jit
def conv_tile(pid, P, OG, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program ``pid`` of an implicit GEMM: its group, output pixels and output channels
    (within the group); pixel tiles vary fastest."""
    tiles_m = tl.cdiv(P, BLOCK_M)
    tiles_n = tl.cdiv(OG, BLOCK_N)
    g = pid // (tiles_m * tiles_n)
    rp = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = ((pid // tiles_m) % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    return g, rp, rn


@triton.jit
def pixel_origins(rp, OH, OW, stride_h, stride_w, pad_h, pad_w):
    """Image, output row and output column of the output pixels ``rp``, and the input row and
    column of their first tap (negative in the padding)."""
    n = rp // (OH * OW)
    oh = (rp // OW) % OH
    ow = rp % OW
    return n, oh, ow, oh * stride_h - pad_h, ow * stride_w - pad_w


def k_splits(steps: int, tiles: int, sms: int) -> int:
    """How many CTAs share the K loop of ``steps`` steps of each of ``tiles`` output tiles on
    ``sms`` SMs: at most :data:`MAX_STEPS` steps a CTA, and, where K has 16 steps or more,
    enough CTAs to busy the SMs while each keeps 4 steps (a short K runs in a few microseconds
    whatever the grid: not worth a split's extra pass); never a split without a step.

    Example:
        >>> k_splits(36, 4, 132), k_splits(9, 4, 132), k_splits(64, 1, 132)
        (9, 1, 16)
    """
    fill = min(triton.cdiv(sms, tiles), steps // 4) if steps >= 16 else 1
    split = max(triton.cdiv(steps, MAX_STEPS), fill, 1)
    return triton.cdiv(steps, triton.cdiv(steps, split))
