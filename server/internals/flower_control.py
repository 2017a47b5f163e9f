"""The SuperLink's Control API from this process: what ``flwr supernode list``, ``flwr supernode register`` and
``flwr ls --run-id`` send, without a ``flwr`` CLI process per call.

Each ``flwr`` CLI command is a fresh Python process that imports Flower's whole CLI (typer, rich, every command):
~1.3 CPU-s on 2 cores for one HTTP request. :class:`Federation <server.deploy.federation.Federation>` asks the
SuperLink which nodes are online once per second while it waits for them, registers every SuperNode key of an
authenticated federation and reads a run's final status; here those are one protobuf-over-HTTP request each
through Flower's own Control API client (``flwr.supercore.control.ControlHttpClient``, with the two request
interceptors the CLI adds: the client identifier and the runtime version). Runs are still submitted with the
real ``flwr run`` CLI (:meth:`Federation.submit`), which streams their logs.

:data:`server.internals.pins.PINS` lists the Flower names used here; ``tests/server/test_internals_pins.py``
pins them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any


class ControlError(RuntimeError):
    """A Control API request failed (refused connection, HTTP error status, a malformed answer)."""


class ControlClient:
    """One Control API connection (``address`` = HOST:PORT; HTTPS verified against ``root_certificates`` when
    given, else plain HTTP). Thread-safe: calls are serialised."""

    def __init__(self, address: str, root_certificates: str | Path | None = None) -> None:
        from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
        from flwr.supercore.control import ControlHttpClient
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

        ca = Path(root_certificates).read_bytes() if root_certificates else None
        self._client = ControlHttpClient.from_server_address(
            server_address=address,
            insecure=ca is None,
            root_certificates=ca,
            interceptors=[CliClientHttpInterceptor(), RuntimeVersionHttpInterceptor(component_name="flwr CLI")],
        )
        self._lock = threading.Lock()

    def _call(self, method: str, request: Any) -> Any:
        import httpx

        with self._lock:
            try:
                return getattr(self._client, method)(request)
            except (httpx.HTTPError, ValueError) as exc:  # ValueError: an unparsable protobuf answer
                raise ControlError(f"Control API {method} failed: {exc}") from exc

    def online_node_ids(self) -> list[int]:
        """IDs of the nodes the SuperLink lists as online (``flwr supernode list``)."""
        from flwr.proto.control_pb2 import ListNodesRequest

        response = self._call("ListNodes", ListNodesRequest())
        return [int(node.node_id) for node in response.nodes_info if node.status == "online"]

    def register_node(self, public_key_file: str | Path) -> int:
        """Register a SuperNode's public key file (OpenSSH format, a NIST EC curve) as ``flwr supernode register``
        does (its checks and PEM encoding, not its loader: that one's ``flwr_exit`` arms a timer which ends the whole
        process); returns the new node ID."""
        from flwr.proto.control_pb2 import RegisterNodeRequest

        public_key = _public_key_bytes(Path(public_key_file))
        node_id = int(self._call("RegisterNode", RegisterNodeRequest(public_key=public_key)).node_id)
        if not node_id:
            raise ControlError("Control API RegisterNode: the SuperLink registered no node")
        return node_id

    def run_status(self, run_id: int) -> str:
        """A run's status as ``flwr ls`` prints it: ``status`` or, once finished, ``status:sub_status``
        ('' for an unknown run)."""
        from flwr.proto.control_pb2 import ListRunsRequest

        runs = self._call("ListRuns", ListRunsRequest(run_id=run_id)).run_dict
        if run_id not in runs:
            return ""
        status = runs[run_id].status
        return f"{status.status}:{status.sub_status}" if status.sub_status else str(status.status)

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _public_key_bytes(path: Path) -> bytes:
    """An OpenSSH EC public key on a NIST curve, PEM-encoded as Flower registers it; else a ControlError."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes, uses_nist_ec_curve

    try:
        key = serialization.load_ssh_public_key(path.read_bytes())
    except (OSError, ValueError, UnsupportedAlgorithm) as exc:
        raise ControlError(f"{path}: not a usable SuperNode public key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not uses_nist_ec_curve(key):
        raise ControlError(f"{path}: not a usable SuperNode public key (an EC key on a NIST curve is needed)")
    return public_key_to_bytes(key)
