"""The error of an invalid configuration (exit status 2 with a one-line message naming the key)."""


class ConfigError(ValueError):
    """An invalid configuration value; the message names the key."""
