"""inq: Incremental Network Quantization (INQ, arXiv 1702.03044) for PyTorch.

The names below load on first use, so ``import inq.kernels`` (or any other submodule) does not
pull in the scheduler; so does every submodule (``inq.masked.save_masked`` works after
``import inq``).

Example:
    >>> import inq, torch
    >>> inq.pow2_quantize(torch.tensor([0.3, -0.7]), n1=0, bits=5)
    tensor([ 0.2500, -0.5000])
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inq import prune
    from inq.allocate import allocate_bits
    from inq.partition import grow_mask, quantized_count
    from inq.pow2 import pow2_decode, pow2_encode, pow2_levels, pow2_n1, pow2_n2, pow2_quantize
    from inq.scheduler import DEFAULT_PORTIONS, INQScheduler

_HOMES = {  # public name -> the module that defines it
    "DEFAULT_PORTIONS": "inq.scheduler",
    "INQScheduler": "inq.scheduler",
    "allocate_bits": "inq.allocate",
    "grow_mask": "inq.partition",
    "quantized_count": "inq.partition",
    "pow2_decode": "inq.pow2",
    "pow2_encode": "inq.pow2",
    "pow2_levels": "inq.pow2",
    "pow2_n1": "inq.pow2",
    "pow2_n2": "inq.pow2",
    "pow2_quantize": "inq.pow2",
    "prune": "inq.prune",
}
__all__ = [
    "DEFAULT_PORTIONS",
    "INQScheduler",
    "allocate_bits",
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


_SUBMODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))  # masked, packed, ...


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name, f"inq.{name}" if name in _SUBMODULES else None)
    if home is None:
        raise AttributeError(f"module 'inq' has no attribute {name!r}")
    module = importlib.import_module(home)
    value = module if home == f"inq.{name}" else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *_SUBMODULES})
