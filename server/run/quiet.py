"""Known harmless library messages that would otherwise open every run.

Each is dropped by an exact-text filter, so anything else those libraries say still shows:

- Flower's ``run_simulation`` deprecation: ``flwr run`` needs a packaged app and a run-config of flat
  scalars; ``flower-simulation`` deliberately drives the same Simulation Runtime from Python with the Hydra
  config (docs/scale.md);
- Flower's "fraction_evaluate is set to 0.0" warning: our strategies evaluate on the server, by design;
- Ray's FutureWarning about ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO``: we rely on today's behaviour (an actor
  with ``num_gpus=0`` sees no GPU), so we keep it rather than set the variable to 0.

torchvision's decode DeprecationWarning is silenced where we import it (``client.data.quiet_torchvision``).
"""

from __future__ import annotations

import logging
import warnings

FLOWER_MESSAGES = (
    "The `run_simulation` function is deprecated",
    "fraction_evaluate is set to 0.0",
)
RAY_ACCELERATOR_TIP = "Tip: In future versions of Ray, Ray will no longer override accelerator"


class _DropMessages(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(m in text for m in FLOWER_MESSAGES)


_FILTER = _DropMessages()


def install() -> None:
    """Idempotent: filter Flower's logger and Ray's accelerator warning in this process."""
    flwr_logger = logging.getLogger("flwr")
    if _FILTER not in flwr_logger.filters:
        flwr_logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", message=RAY_ACCELERATOR_TIP, category=FutureWarning)
