"""Deprecated alias of :mod:`inq.masked`, the masked checkpoint (format ``inq-masked/3``); kept
for one release, it will be removed in the next.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", DeprecationWarning)
    ...     from inq.export import save_masked
    >>> import inq.masked
    >>> save_masked is inq.masked.save_masked
    True
"""

from __future__ import annotations

import warnings

from inq.masked import MASKED_FORMATS, MaskedCheckpoint, load_masked, save_masked

__all__ = ["MASKED_FORMATS", "MaskedCheckpoint", "load_masked", "save_masked"]

warnings.warn(
    "inq.export is deprecated and will be removed in the next release: import from inq.masked "
    "(save_masked, load_masked, MaskedCheckpoint, MASKED_FORMATS)",
    DeprecationWarning,
    stacklevel=2,
)
