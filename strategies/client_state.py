"""Node-local client state of LocalGHBM and FedHBM, the only algorithms whose clients remember a round.

LocalGHBM keeps the global model it received at its previous participation (the anchor), FedHBM its own final
local model of that participation (docs/ghbm.md). The state must survive across rounds in simulation (Ray
actors come and go) and in a deployment (every message runs in a fresh ``flwr-clientapp`` process), and a
resumed run — a checkpoint resume in ``flower-simulation``, a SuperLink restart in ``flower-deploy``, both new
Flower runs with a fresh ``Context.state`` — must give the bitwise-same model as an uninterrupted one. So it
lives in files on the node's disk, one directory per (run, partition)::

    <state dir>/<run id>/partition-<id>/r<round:08d>-<segment id>.npz

- The run id is created by the server at a fresh start and kept in its checkpoint; a new run never sees the
  states of another one.
- Each server start (the fresh start, every resume) opens a *segment* (first round, random id); the server
  sends the list of segments. A file made in round r is valid only if its segment id is that of the segment
  holding r: after a resume from the checkpoint of round c, states the killed run made after c (rounds the
  server has forgotten) are ignored and deleted, even if that partition is not asked again in the same round.
- In round t the client uses the newest valid state from a round < t (first participation when none).
- Pruning keeps what a resume may still need: the newest valid state from a round <= the last checkpointed
  round the server sends, and every valid state after it.
- A file is untrusted input: keys, shapes and dtypes must match the received model and values must be finite;
  a corrupt or unreadable state is logged, reported (``state-invalid``) and the round runs as a first
  participation.
- A state is written whole to a temporary file and renamed into place, as the server's checkpoint is: a killed
  process leaves the old state or the new one, never a part. Like the checkpoint it is not forced to the disk
  (no fsync, which cost about half of a state's write and read): after an operating-system crash a recent state
  may be missing or corrupt, and is then handled as above.

Everything here is numpy, so the CIFAR-10 ClientApp and the quadratic test apps share it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strategies import client_step, npy, protocol
from strategies import math as fm

log = logging.getLogger(__name__)
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FILE = re.compile(r"^r(\d{8})-([A-Za-z0-9_-]{1,64})\.npz$")
Arrays = dict[str, np.ndarray]


def new_id() -> str:
    """A random identity for a run or a segment (not drawn from the seeded generators)."""
    return secrets.token_hex(6)


def _checked_id(value: object, what: str) -> str:
    text = str(value)
    if not _ID.match(text):
        raise ValueError(f"{what} must match {_ID.pattern}, got {value!r}")
    return text


@dataclass(frozen=True)
class Lineage:
    """The server starts of a run: segment k covers rounds starts[k] .. starts[k+1] - 1."""

    starts: tuple[int, ...]
    ids: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.starts or len(self.starts) != len(self.ids):
            raise ValueError("client-state segments need as many starts as ids (at least one)")
        if any(b <= a for a, b in zip(self.starts, self.starts[1:])) or self.starts[0] < 1:
            raise ValueError(f"client-state segment starts must increase from >= 1, got {list(self.starts)}")
        for seg in self.ids:
            _checked_id(seg, "client-state segment id")

    def segment_of(self, server_round: int) -> str | None:
        """Id of the segment holding ``server_round`` (None before the first start)."""
        seg = None
        for start, ident in zip(self.starts, self.ids):
            if start <= server_round:
                seg = ident
        return seg

    @property
    def current(self) -> str:
        return self.ids[-1]


class ClientStateStore:
    """The state files of one partition in one run (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, run: str, partition_id: int, lineage: Lineage, keep_round: int):
        self.path = Path(root) / _checked_id(run, "client-state run id") / f"partition-{int(partition_id)}"
        self.lineage = lineage
        self.keep_round = int(keep_round)

    @classmethod
    def from_config(cls, config: Mapping, partition_id: int, node_config: Mapping | None = None) -> ClientStateStore:
        """The store a train message points to; ``node_config["client-state-dir"]`` overrides the directory."""
        root = (node_config or {}).get(protocol.STATE_DIR) or config.get(protocol.STATE_DIR)
        if not root:
            raise ValueError(f"config key {protocol.STATE_DIR!r} (or node_config[{protocol.STATE_DIR!r}]) is required")
        for key in (protocol.STATE_RUN, protocol.STATE_STARTS, protocol.STATE_IDS, protocol.STATE_KEEP):
            if key not in config:
                raise ValueError(f"train config of a stateful algorithm lacks {key!r}")
        lineage = Lineage(
            tuple(int(s) for s in config[protocol.STATE_STARTS]), tuple(str(s) for s in config[protocol.STATE_IDS])
        )
        return cls(str(root), str(config[protocol.STATE_RUN]), partition_id, lineage, int(config[protocol.STATE_KEEP]))

    # ----------------------------------------------------------------------- files
    def _files(self) -> list[tuple[int, str, Path]]:
        """(round, segment id, path) of every state file, oldest first."""
        if not self.path.is_dir():
            return []
        out = []
        for entry in self.path.iterdir():
            match = _FILE.match(entry.name)
            if match:
                out.append((int(match.group(1)), match.group(2), entry))
        return sorted(out)

    def _valid(self, server_round: int, segment: str) -> bool:
        return self.lineage.segment_of(server_round) == segment

    def load(self, server_round: int, like: Mapping[str, np.ndarray]) -> tuple[int, Arrays] | None:
        """(round, arrays) of the newest valid state from a round < ``server_round``; None when there is none.

        ``like`` gives the expected keys, shapes and dtypes. A file that fails the checks raises
        :class:`CorruptState`.
        """
        candidates = [(r, p) for r, seg, p in self._files() if r < server_round and self._valid(r, seg)]
        if not candidates:
            return None
        made_in, path = candidates[-1]
        return made_in, _read_checked(path, like)

    def save(self, server_round: int, arrays: Mapping[str, np.ndarray]) -> Path:
        """Write the state made in ``server_round`` atomically, then prune."""
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / f"r{int(server_round):08d}-{self.lineage.current}.npz"
        tmp = self.path / f".tmp-{os.getpid()}-{new_id()}.npz"
        with open(tmp, "wb") as fh:  # straight to the file: through a BytesIO a CNN's state took 2-4x as long
            np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})
        os.replace(tmp, final)
        self.prune()
        return final

    def prune(self) -> None:
        """Delete invalid states and valid ones older than the newest from a round <= keep_round."""
        files = self._files()
        valid = [(r, p) for r, seg, p in files if self._valid(r, seg)]
        settled = [r for r, _ in valid if r <= self.keep_round]
        oldest_kept = settled[-1] if settled else -1
        for r, seg, p in files:
            if not self._valid(r, seg) or r < oldest_kept:
                p.unlink(missing_ok=True)


class CorruptState(ValueError):
    """A state file that cannot be used; the message says why."""


def _read_expected(path: Path, like: Mapping[str, np.ndarray]) -> Arrays | None:
    """The state's arrays when the file holds exactly ``like``'s keys, each ``.npy`` member as ``np.savez`` writes it
    for that dtype and shape (:func:`strategies.npy.decode`, with the zip's checksums: 2.4x faster than ``np.load``
    for ResNet-20's 65 arrays); None for anything else, which :func:`_read_checked` then reads and judges."""
    try:
        with zipfile.ZipFile(path) as archive:
            if sorted(archive.namelist()) != sorted(f"{k}.npy" for k in like):
                return None
            out = {}
            for key, ref in like.items():
                value = npy.decode(archive.read(f"{key}.npy"), np.asarray(ref).dtype, tuple(np.shape(ref)))
                if value is None:
                    return None
                out[key] = value
            return out
    except Exception:  # noqa: BLE001 - a damaged file: np.load's reading says why
        return None


def _read_checked(path: Path, like: Mapping[str, np.ndarray]) -> Arrays:
    arrays = _read_expected(path, like)
    if arrays is None:
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as err:  # truncated zip, bad header, pickled object: the file is unusable
            raise CorruptState(f"{path.name} cannot be read ({type(err).__name__})") from None
    if sorted(arrays) != sorted(like):
        raise CorruptState(f"{path.name} holds keys {sorted(arrays)[:3]}..., expected the model's")
    for key, ref in like.items():
        value = arrays[key]
        if value.shape != np.shape(ref) or value.dtype != np.asarray(ref).dtype:
            raise CorruptState(
                f"{path.name}: {key!r} is {value.dtype}{value.shape}, expected {np.asarray(ref).dtype}{np.shape(ref)}"
            )
        if not np.all(np.isfinite(value)):
            raise CorruptState(f"{path.name}: {key!r} has non-finite values")
    return arrays


# --------------------------------------------------------------------------- the algorithms' client side
def round_input(
    store: ClientStateStore, algorithm: str, server_round: int, received: Mapping[str, np.ndarray]
) -> tuple[Arrays | None, dict[str, int]]:
    """What this round's local steps need from the state, and the state metrics.

    LocalGHBM: m_i = (anchor_i - theta^{t-1}) / tau_i with tau_i = t - (round of the state)
    (:func:`strategies.math.ghbm_momentum`). FedHBM: the anchor a_i itself (the per-step momentum
    C (a_i - theta_{i,k}) is formed by the local steps). None at a first participation or when the stored
    state is corrupt (logged; ``state-invalid`` = 1).
    """
    if not client_step.algorithm(algorithm).stateful:
        raise ValueError(f"{algorithm!r} keeps no client state")
    try:
        loaded = store.load(server_round, received)
    except CorruptState as err:
        log.warning(
            "Ignoring the client state of %s (running round %d as a first participation): %s",
            store.path,
            server_round,
            err,
        )
        return None, {protocol.STATE_ROUNDS: 0, protocol.STATE_INVALID: 1}
    if loaded is None:
        return None, {protocol.STATE_ROUNDS: 0, protocol.STATE_INVALID: 0}
    made_in, anchor = loaded
    metrics = {protocol.STATE_ROUNDS: int(server_round - made_in), protocol.STATE_INVALID: 0}
    if algorithm == "fedhbm":
        return anchor, metrics
    keys = list(received)
    momentum = fm.ghbm_momentum([anchor[k] for k in keys], [received[k] for k in keys], server_round - made_in)
    return dict(zip(keys, momentum)), metrics


def remember(
    store: ClientStateStore,
    algorithm: str,
    server_round: int,
    received: Mapping[str, np.ndarray],
    local: Mapping[str, np.ndarray],
) -> None:
    """Store this round's state: the received model (LocalGHBM) or the final local model (FedHBM)."""
    store.save(server_round, received if algorithm == "localghbm" else local)
