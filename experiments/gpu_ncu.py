"""One linear case of ``inq bench kernel`` for Nsight Compute to profile (``gpu_check.sh``).

    ncu --launch-skip 3 --launch-count 1 -k "regex:_mma_kernel|_gemv_kernel" \
        python3 experiments/gpu_ncu.py 1

Runs ``inq::shift_linear`` on a 4096 x 4096 weight of random 4-bit codes at the given batch
(fp16) four times: the first three build the kernel layout and compile (skipped by ncu), the
fourth is the one profiled.
"""

from __future__ import annotations

import argparse

import torch

import inq.kernels  # noqa: F401  (registers torch.ops.inq.*)
from inq.codes import pack_codes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batch", type=int)
    parser.add_argument("--out-features", type=int, default=4096)
    parser.add_argument("--in-features", type=int, default=4096)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(8, 16, (args.out_features, args.in_features), generator=gen)
    packed = pack_codes(codes.to(torch.uint8), 4).cuda()
    x = torch.randn(args.batch, args.in_features, dtype=torch.float16, device="cuda")
    for _ in range(4):
        torch.ops.inq.shift_linear(x, packed, 4, -3, args.in_features, None)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
