"""Index math the convolution kernels share: which output pixels and channels a program
owns, and where their receptive fields start; and the longest serial K loop a CTA may run."""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["MAX_STEPS", "conv_tile", "pixel_origins"]

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
