"""The one error type a user's input can cause (it names the config key to fix), and how to find
the exception another was raised while handling."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["ConfigError", "raised_while_handling"]

_E = TypeVar("_E", bound=BaseException)


class ConfigError(ValueError):
    """A bad config value, missing dataset or unreadable checkpoint; ``key`` is what to change.

    Example:
        >>> str(ConfigError("data.root", "/nope does not exist"))
        'data.root: /nope does not exist'
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # pickled between DDP ranks
        return ConfigError, (self.key, self.message)


def raised_while_handling(err: BaseException, kind: type[_E]) -> _E | None:
    """``err`` if it is a ``kind``, else the ``kind`` it was raised while handling (its
    ``__context__`` chain), if any: a library whose cleanup fails turns a stop into its own
    error (OmegaConf on a half-built node, torchrun's metrics wrapper).

    Example:
        >>> try:
        ...     try:
        ...         raise KeyboardInterrupt
        ...     finally:
        ...         raise AttributeError("half-built")
        ... except AttributeError as err:
        ...     type(raised_while_handling(err, KeyboardInterrupt)).__name__
        'KeyboardInterrupt'
        >>> raised_while_handling(OSError(), KeyboardInterrupt) is None
        True
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None
