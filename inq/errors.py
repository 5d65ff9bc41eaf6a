"""The one error type a user's input can cause: it names the config key to fix."""

from __future__ import annotations

__all__ = ["ConfigError"]


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
