"""Known harmless library messages are silenced at their source, others still show (issue 8 §6).

The end-to-end check (a real run's console holds none of them) is in test_ray_local.py.
"""

import logging
import warnings
from pathlib import Path

from server.run import quiet

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_installs_without_setuptools_warnings():
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught] == []  # e.g. "`project.license` as a TOML table is deprecated"
    assert dist.metadata.license_expression == "Apache-2.0"


def test_flower_filter_drops_only_the_known_messages(caplog):
    quiet.install()
    quiet.install()  # idempotent
    logger = logging.getLogger("flwr")
    assert logger.filters.count(quiet._FILTER) == 1
    with caplog.at_level(logging.INFO, logger="flwr"):
        logger.warning("DEPRECATED FEATURE: %s", "The `run_simulation` function is deprecated and will be removed")
        logger.warning("fraction_evaluate is set to 0.0. Federated evaluation will be skipped.")
        logger.warning("[round 1/2] something the user must see")
    assert [r.getMessage() for r in caplog.records] == ["[round 1/2] something the user must see"]


def test_ray_accelerator_tip_is_ignored_and_other_future_warnings_are_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet.install()
        warnings.warn(quiet.RAY_ACCELERATOR_TIP + " if num_gpus=0 ...", FutureWarning, stacklevel=1)
        warnings.warn("something else will change", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else will change"]
