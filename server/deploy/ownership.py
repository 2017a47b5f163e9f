"""Which SuperNode key serves which partition: the operator's decision, written down before the run.

With SuperNode authentication a node id is the SuperLink's record of one registered public key, and the ServerApp
reads that key for every node id from the SuperLink (``grid.get_nodes()``: ``NodeInfo.public_key``). So
``flower-deploy`` hands the ServerApp a map *key fingerprint -> partition* (``deploy.partition_owners``), and the
client manager refuses every claim whose node's key does not own the claimed partition
(:mod:`strategies.claims`). The map holds the keys of the SuperNodes ``flower-deploy`` spawns (partitions
0..k-1) and, for the others, the operator's file ``deploy.partition_keys``::

    # partition-id  key (an OpenSSH public key line, or its SHA256 fingerprint as `ssh-keygen -lf` prints it)
    2 ecdsa-sha2-nistp384 AAAAE2VjZHNh... node2@host
    3 SHA256:2H6lNq3b0i6yJm0wqkS1o2rVYc7n8l3n9K1x0n1P3kE

A malformed file is a one-line configuration error before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.run.config import ConfigError
from strategies.claims import FINGERPRINT_PREFIX, key_fingerprint

KEY = "deploy.partition_keys"
FINGERPRINT_LENGTH = 43  # base64 of a SHA-256 digest without padding


def parse_keys_file(path: str | Path, num_partitions: int, spawned: int = 0) -> dict[str, int]:
    """Fingerprint -> partition from the operator's file; raises :class:`ConfigError` (one line) when it is
    unreadable or malformed, names a partition outside [spawned, num_partitions) or a partition or key twice."""
    file = Path(str(path)).expanduser()
    try:
        lines = file.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"'{KEY}': cannot read {file}: {err.__class__.__name__}") from None
    owners: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"'{KEY}' {file} line {number}"
        fields = line.split(None, 1)
        if len(fields) != 2 or not fields[0].lstrip("-").isdigit():
            raise ConfigError(f"{where}: expected '<partition-id> <OpenSSH public key or SHA256:fingerprint>'")
        partition = int(fields[0])
        if not spawned <= partition < num_partitions:
            spawned_note = f" (0..{spawned - 1}: SuperNodes spawned here, with keys made here)" if spawned else ""
            raise ConfigError(f"{where}: partition {partition} is outside [{spawned}, {num_partitions}){spawned_note}")
        fingerprint = _fingerprint(fields[1], where)
        if fingerprint in owners:
            raise ConfigError(f"{where}: key {fingerprint} already serves partition {owners[fingerprint]}")
        if partition in owners.values():
            raise ConfigError(f"{where}: partition {partition} already has a key")
        owners[fingerprint] = partition
    return owners


def _fingerprint(text: str, where: str) -> str:
    text = text.strip()
    if text.startswith(FINGERPRINT_PREFIX):
        if len(text) != len(FINGERPRINT_PREFIX) + FINGERPRINT_LENGTH or " " in text:
            raise ConfigError(f"{where}: {text!r} is not a SHA256 key fingerprint")
        return text
    try:
        return key_fingerprint(text)
    except ValueError:
        raise ConfigError(f"{where}: not an OpenSSH public key or a SHA256:fingerprint") from None


def check(cfg: dict[str, Any]) -> dict[str, int] | None:
    """Validate ``deploy.partition_keys`` against the rest of the config (before any process starts); returns
    the operator's part of the map, or None when partitions are not owned by keys."""
    d, n = cfg["deploy"], int(cfg["num_clients"])
    remote = d.get("superlink") is not None
    spawned = 0 if remote else int(d.get("spawn_supernodes", 0) or 0)
    path = d.get("partition_keys")
    if path is None:
        if d.get("auth") and spawned < n:
            raise ConfigError(
                f"'deploy.auth=true' with spawn_supernodes={spawned} < num_clients={n}: give "
                f"'{KEY}' (a file mapping partitions {spawned}..{n - 1} to their SuperNodes' keys)"
            )
        return None
    if not remote and not d.get("auth"):
        raise ConfigError(
            f"'{KEY}' needs 'deploy.auth=true': without SuperNode authentication a node can register any public key"
        )
    owners = parse_keys_file(path, n, spawned)
    missing = sorted(set(range(spawned, n)) - set(owners.values()))
    if missing:
        raise ConfigError(f"'{KEY}' gives no key for partitions {missing} (every partition not spawned here needs one)")
    return owners


def owners_map(spawned_keys: dict[int, Path], listed: dict[str, int] | None) -> dict[str, int]:
    """Fingerprint -> partition: the spawned SuperNodes' keys (partition -> public key file) plus the file's."""
    owners = {key_fingerprint(path.read_text()): partition for partition, path in spawned_keys.items()}
    clash = set(owners) & set(listed or {})
    if clash:
        raise ConfigError(f"'{KEY}' lists the key of a SuperNode spawned here: {sorted(clash)[0]}")
    return {**owners, **(listed or {})}
