"""Partition claims: what a node's answer to the partition query must satisfy, and SuperNode key fingerprints.

A node answers the partition query with ``{"partition-id": p, "num-partitions": n}`` (its ``--node-config``).
:class:`ClaimRules` checks every claim: ``p`` an integer in [0, N), ``n`` (when given) equal to the run's N and,
with key ownership (``owners``: key fingerprint -> partition, written down by the operator before the run), the
node's public key must own ``p``. The node's key is not the node's word: it is what the SuperLink stores for the
node id, set by ``flwr supernode register`` and checked on every Fleet API call of the node (SuperNode
authentication; docs/deploy.md "Security").
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from typing import Any

from strategies import protocol

FINGERPRINT_PREFIX = "SHA256:"


class RefusedClaim(ValueError):
    """A partition claim that breaks a rule; the message is the reason that gets logged."""


def key_fingerprint(key: bytes | str) -> str:
    """The OpenSSH fingerprint (``SHA256:…``, what ``ssh-keygen -lf node.pub`` prints) of a public key given as
    PEM (how the SuperLink stores it) or as an OpenSSH line (``ecdsa-sha2-nistp384 AAAA… [comment]``)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    data = key.encode() if isinstance(key, str) else bytes(key)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            line = serialization.load_pem_public_key(data).public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        else:
            line = b" ".join(data.split()[:2])
            serialization.load_ssh_public_key(line)
        blob = base64.b64decode(line.split()[1])
    except (ValueError, IndexError, TypeError, UnsupportedAlgorithm) as err:
        raise ValueError(f"not a PEM or OpenSSH public key ({err.__class__.__name__})") from None
    return FINGERPRINT_PREFIX + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def claim_record(content: Any) -> Mapping[str, Any] | None:
    """The config record of a query reply that holds the claim, or None."""
    for record in content.config_records.values():
        if protocol.PARTITION_ID in record:
            return record
    return None


class ClaimRules:
    """The rules every partition claim must pass (see the module doc); :meth:`check` returns the partition."""

    def __init__(self, num_partitions: int, owners: Mapping[str, int] | None = None) -> None:
        self.num_partitions = num_partitions
        self.owners = dict(owners) if owners is not None else None

    def owned(self, fingerprint: str | None) -> int | None:
        """The partition a key owns (None: no ownership map, an unknown key or no key)."""
        return None if self.owners is None or fingerprint is None else self.owners.get(fingerprint)

    def check(self, record: Mapping[str, Any] | None, fingerprint: str | None = None) -> int:
        """The claimed partition id; raises :class:`RefusedClaim` with the reason when a rule is broken."""
        if record is None:
            raise RefusedClaim(f"its answer holds no {protocol.PARTITION_ID!r}")
        value = record[protocol.PARTITION_ID]
        if isinstance(value, bool) or not isinstance(value, int):
            raise RefusedClaim(f"partition-id {value!r} is not an integer")
        if not 0 <= value < self.num_partitions:
            raise RefusedClaim(f"partition {value} is outside [0, {self.num_partitions})")
        claimed_n = record.get(protocol.NUM_PARTITIONS)
        if claimed_n is not None and (isinstance(claimed_n, bool) or claimed_n != self.num_partitions):
            raise RefusedClaim(
                f"it claims partition {value} of num-partitions={claimed_n!r}, the run has {self.num_partitions}"
            )
        if self.owners is not None:
            if fingerprint is None:
                raise RefusedClaim(f"it claims partition {value}, but the SuperLink gives no public key for it")
            owned = self.owners.get(fingerprint)
            if owned != value:
                owns = "no partition" if owned is None else f"partition {owned}"
                raise RefusedClaim(f"it claims partition {value}, but its key {fingerprint} owns {owns}")
        return value
