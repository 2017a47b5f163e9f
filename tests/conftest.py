"""Shared test setup: make tests/ importable (toy ClientApps must live in importable modules), and keep the
tests that share a costly fixture on one pytest-xdist worker (``make test`` runs ``-n 2 --dist loadgroup``)."""

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Each pytest-xdist worker gets its share of the cores for torch's intra-op threads, and so does every process it
# starts (flower-simulation, a deployment's ServerApp and ClientApps): client/threads.py's rule for SuperNodes on one
# host. With torch's default (one thread per core) in each of 2 workers on 2 cores the idle threads spin: measured on
# tests/client/test_stacked.py alone, 28.6 -> 19.0 CPU-s at the same wall time (docs/benchmarks.md, issue 18).
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    from client.threads import local_share, usable_cores

    os.environ.setdefault(
        "OMP_NUM_THREADS", str(local_share(usable_cores(), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 10-class ImageFolder tree (12 train / 4 test images per class), its .tar.gz and a cache dir: the data of
    the end-to-end tests (helpers: simcli.py)."""
    from tools.datagen import make_image_folder, make_tarball

    root = tmp_path_factory.mktemp("data")
    folder = make_image_folder(root / "folder", per_class=12, test_per_class=4, seed=1)
    tarball = make_tarball(folder, root / "tiny.tar.gz")
    return {"folder": folder, "tarball": tarball, "cache": root / "cache"}


# session fixtures too costly to build once per xdist worker
SHARED_SESSION_FIXTURES = ("reference_deploy", "toy_simulation")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the marks into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test that uses a module-scoped fixture (a multirun, a cluster, one run_simulation shared by
    the module) or a costly session fixture with an ``xdist_group``: under ``--dist loadgroup`` the group runs
    on one worker, so the fixture is built once, as in a serial run. Other tests are spread one by one."""
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if "PYTEST_XDIST_WORKER" in os.environ:
        items.sort(key=start_rank)


def start_rank(item: pytest.Item) -> int:
    """Under xdist, tests marked ``slow`` start first, the rest keep their collection order: xdist hands out groups
    first, then single tests in this order, and a long single test collected last leaves the other worker idle
    (measured: test_flower_equivalence.py, 40 s, ran last and one worker waited 36 s). Not every e2e test first:
    two heavy tests side by side contend for the 2 cores (a full suite so ordered took 895 CPU-s against 832)."""
    return 0 if item.get_closest_marker("slow") else 1


def xdist_group(item: pytest.Item) -> str | None:
    """The group of ``item``: the costly session fixture it uses, else its module when it uses a module-scoped
    fixture, else None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in SHARED_SESSION_FIXTURES:
        if name in info.names_closure:
            return name
    if any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values()):
        return item.nodeid.split("::")[0]
    return None
