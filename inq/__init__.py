"""inq: Incremental Network Quantization (INQ, arXiv 1702.03044) for PyTorch.

Example:
    >>> import inq, torch
    >>> inq.pow2_quantize(torch.tensor([0.3, -0.7]), n1=0, bits=5)
    tensor([ 0.2500, -0.5000])
"""

from inq import prune
from inq.partition import grow_mask, quantized_count
from inq.pow2 import pow2_decode, pow2_encode, pow2_levels, pow2_n1, pow2_n2, pow2_quantize
from inq.scheduler import DEFAULT_PORTIONS, INQScheduler

__all__ = [
    "DEFAULT_PORTIONS",
    "INQScheduler",
    "grow_mask",
    "pow2_decode",
    "pow2_encode",
    "pow2_levels",
    "pow2_n1",
    "pow2_n2",
    "pow2_quantize",
    "prune",
    "quantized_count",
]
__version__ = "0.1.0"
