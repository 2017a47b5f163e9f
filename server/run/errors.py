"""The error of an invalid configuration (exit status 2 with a one-line message naming the key)."""


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of ``err``'s message (at most ``limit`` characters), or its type's name when it has none."""
    lines = str(err).strip().splitlines()
    return lines[0][:limit] if lines else type(err).__name__
