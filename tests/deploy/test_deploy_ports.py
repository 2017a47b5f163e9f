"""Free ports that another process takes first: the race behind a chance failure of the suite (a SuperNode's Runtime
API port, picked free, was taken by another process's connection before the SuperNode bound it; the run then waited
300 s for the missing node). Ports now come from below the ephemeral range, and a SuperLink or SuperNode that loses
its port anyway starts again on another one. Real processes, no federation needed for the SuperNode case (it binds
its Runtime API before it looks for a SuperLink)."""

from __future__ import annotations

import socket
import sys

import pytest

from server.deploy.federation import DeployError, Federation, FederationOptions
from server.run import procs


def test_free_ports_lie_below_the_ephemeral_range_and_are_never_repeated():
    low, _ = procs.ephemeral_range()
    ports = [procs.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(20000 <= p < low for p in ports), ports
    for port in ports[:5]:  # free when handed out
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


@pytest.fixture
def taken_port():
    """A port held by a listening socket (another process's server, as far as the federation can tell)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def _first_pick(monkeypatch, port: int, count: int = 1) -> None:
    """``procs.free_port`` hands out ``port`` for its next ``count`` calls (the race, lost), then free ports."""
    real, left = procs.free_port, [count]

    def pick(host: str = "127.0.0.1") -> int:
        if left[0] > 0:
            left[0] -= 1
            return port
        return real(host)

    monkeypatch.setattr(procs, "free_port", pick)


@pytest.mark.e2e
def test_a_supernode_whose_port_was_taken_starts_again_on_another(tmp_path, monkeypatch, taken_port):
    notices: list[str] = []
    fed = Federation(tmp_path / "fed", tmp_path, FederationOptions(startup_timeout=60))
    fed.on_notice = notices.append
    _first_pick(monkeypatch, taken_port)
    try:
        fed.start_supernode(0, 1)
        node = fed.supernodes[0]
        assert node.alive() and f"--port {taken_port} " not in " ".join(node.cmd) + " "
        log = node.log_path.read_text()
        assert log.count("\n$ ") == 2 and "already in use" in log  # the lost start, then the one that bound
        assert len(notices) == 1 and "supernode-0's port was taken" in notices[0] and "attempt 2 of 3" in notices[0]
    finally:
        fed.stop()


@pytest.mark.e2e
def test_a_supernode_that_keeps_losing_its_port_or_exits_otherwise_is_one_clear_error(
    tmp_path, monkeypatch, taken_port
):
    fed = Federation(tmp_path / "fed", tmp_path, FederationOptions(startup_timeout=60))
    fed.on_notice = lambda line: None
    _first_pick(monkeypatch, taken_port, count=3)
    try:
        with pytest.raises(DeployError, match="supernode-0 exited with code .* while starting"):
            fed.start_supernode(0, 1)
        assert fed.supernodes[0].log_path.read_text().count("already in use") == 3
        # any other exit during start-up: no retry, the log's tail in the error
        monkeypatch.setattr(fed, "supernode_command", lambda *a: [sys.executable, "-c", "raise SystemExit('boom')"])
        with pytest.raises(DeployError, match="(?s)supernode-1 exited with code 1 while starting.*boom"):
            fed.start_supernode(1, 2)
    finally:
        fed.stop()


@pytest.mark.e2e
def test_a_superlink_whose_first_port_was_taken_starts_on_other_ports(tmp_path, monkeypatch, taken_port):
    notices: list[str] = []
    _first_pick(monkeypatch, taken_port)  # the Fleet API port: picked first
    fed = Federation(tmp_path / "fed", tmp_path, FederationOptions(startup_timeout=60))
    fed.on_notice = notices.append
    assert fed.fleet_port == taken_port
    try:
        fed.start_superlink()
        assert fed.superlink is not None and fed.superlink.alive()
        assert fed.fleet_port != taken_port and fed.fleet_address.endswith(f":{fed.fleet_port}")
        assert f'address = "{fed.control_address}"' in (fed.flwr_home / "config.toml").read_text()
        assert len(notices) == 1 and "SuperLink's port was taken" in notices[0]
        assert "already in use" in fed.log_dir.joinpath("superlink.log").read_text()
    finally:
        fed.stop()
