"""Flower's console handler: the handler class ``flwr.common.logger`` installs on the "flwr" logger (not public)."""

from __future__ import annotations

import logging

from flwr.common.logger import ConsoleHandler


def console_handlers() -> list[logging.Handler]:
    """The console handlers of Flower's logger in this process."""
    return [h for h in logging.getLogger("flwr").handlers if isinstance(h, ConsoleHandler)]
