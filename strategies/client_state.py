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

Nodes simulated inside the server's process (``engine=batched`` and the stacked launcher, which put their pid in
``node_config["client-state-memory"]``) keep each partition's newest state in memory instead, up to
:data:`MEMORY_BUDGET` bytes a process, and write those states to the same files only when the server is about to save
a checkpoint (:func:`flush`): the files a resume reads are the ones above, and a round writes no file.

Everything here is numpy, so the CIFAR-10 ClientApp and the quadratic test apps share it.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strategies import client_step, npy, protocol
from strategies import math as fm

log = logging.getLogger("flwr")  # Flower's: the node's console and logs, a simulated run's run.log
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FILE = re.compile(r"^r(\d{8})-([A-Za-z0-9_-]{1,64})\.npz$")
Arrays = dict[str, np.ndarray]
MEMORY_BUDGET = 2 << 30  # bytes of states a process keeps in memory; beyond it states are written to files at once


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

    def __init__(
        self,
        root: str | os.PathLike,
        run: str,
        partition_id: int,
        lineage: Lineage,
        keep_round: int,
        in_memory: bool = False,
    ):
        self.run = _checked_id(run, "client-state run id")
        self.path = Path(root) / self.run / f"partition-{int(partition_id)}"
        self.lineage = lineage
        self.keep_round = int(keep_round)
        self.in_memory = in_memory  # the newest state in this process's memory, files at checkpoints (:func:`flush`)

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
        in_memory = (node_config or {}).get(protocol.STATE_MEMORY) == os.getpid()  # a node of this very process
        run, keep = str(config[protocol.STATE_RUN]), int(config[protocol.STATE_KEEP])
        return cls(str(root), run, partition_id, lineage, keep, in_memory=in_memory)

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
        kept = _MEMORY.get(self.path)
        candidates = [(r, p) for r, seg, p in self._files() if r < server_round and self._valid(r, seg)]
        if kept is not None and kept.round < server_round and self._valid(kept.round, kept.segment):
            if not candidates or candidates[-1][0] <= kept.round:  # a file is newer only if another process wrote it
                return kept.round, _checked(kept.arrays, like, f"the state of round {kept.round}")
        if not candidates:
            return None
        made_in, path = candidates[-1]
        return made_in, _read_checked(path, like)

    def save(self, server_round: int, arrays: Mapping[str, np.ndarray]) -> Path | None:
        """Keep the state made in ``server_round``: in memory (``in_memory``, within :data:`MEMORY_BUDGET`; None), else
        written atomically to its file (returned), then prune."""
        if self.in_memory and _MEMORY.keep(self, int(server_round), arrays):
            return None
        return self._write(int(server_round), self.lineage.current, arrays)

    def _write(
        self, server_round: int, segment: str, arrays: Mapping[str, np.ndarray], keep_round: int | None = None
    ) -> Path:
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.path / f"r{server_round:08d}-{segment}.npz"
        tmp = self.path / f".tmp-{os.getpid()}-{new_id()}.npz"
        try:
            with open(tmp, "wb") as fh:  # straight to the file: through a BytesIO a CNN's state took 2-4x as long
                np.savez(fh, **{k: np.asarray(v) for k, v in arrays.items()})
        except OSError:  # e.g. a full disk: the partial file goes (nothing else would remove it)
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, final)
        self.prune(keep_round)
        return final

    def prune(self, keep_round: int | None = None) -> None:
        """Delete invalid states and valid ones older than the newest from a round <= ``keep_round`` (default: the
        message's)."""
        keep = self.keep_round if keep_round is None else int(keep_round)
        files = self._files()
        valid = [(r, p) for r, seg, p in files if self._valid(r, seg)]
        settled = [r for r, _ in valid if r <= keep]
        oldest_kept = settled[-1] if settled else -1
        for r, seg, p in files:
            if not self._valid(r, seg) or r < oldest_kept:
                p.unlink(missing_ok=True)


@dataclass
class _Kept:
    """A partition's newest state in memory: its store, the round and segment it was made in, a copy of its arrays."""

    store: ClientStateStore
    round: int
    segment: str
    arrays: Arrays
    size: int
    written: bool = False  # already in its file (an earlier flush)


class _Memory:
    """The newest state of each partition whose store is ``in_memory``, by store path, within :data:`MEMORY_BUDGET`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.kept: dict[Path, _Kept] = {}
        self.bytes = 0

    def get(self, path: Path) -> _Kept | None:
        return self.kept.get(path)

    def keep(self, store: ClientStateStore, server_round: int, arrays: Mapping[str, np.ndarray]) -> bool:
        """A copy of ``arrays`` becomes ``store``'s newest state; False when it would pass the budget (the older one
        is dropped all the same: a flush wrote it if a resume may need it)."""
        size = sum(np.asarray(v).nbytes for v in arrays.values())
        with self.lock:
            old = self.kept.pop(store.path, None)
            self.bytes -= old.size if old is not None else 0
            if self.bytes + size > MEMORY_BUDGET:
                return False
            self.bytes += size
        copies = {k: np.array(v, copy=True) for k, v in arrays.items()}  # the reply's arrays may view a chunk's buffer
        kept = _Kept(store, server_round, store.lineage.current, copies, size)
        with self.lock:
            self.kept[store.path] = kept
        return True

    def of_run(self, run: str) -> list[_Kept]:
        with self.lock:
            return [k for k in self.kept.values() if k.store.run == run]

    def forget(self, run: str) -> None:
        with self.lock:
            for path in [p for p, k in self.kept.items() if k.store.run == run]:
                self.bytes -= self.kept.pop(path).size


_MEMORY = _Memory()


def flush(run: str, keep_round: int) -> int:
    """Write every state of ``run`` kept in memory to its file, then prune each of those partitions with
    ``keep_round``; returns the files written. The server calls it before it saves a checkpoint, with the round of
    the last checkpoint already saved (a resume from it may still need an older file) or, before any, the round
    about to be saved."""
    written = 0
    for kept in _MEMORY.of_run(run):
        if not kept.written:
            kept.store._write(kept.round, kept.segment, kept.arrays, keep_round)
            kept.written = True
            written += 1
    return written


def forget(run: str) -> None:
    """Drop the states of ``run`` kept in memory (the run has ended; its last checkpoint flushed them)."""
    _MEMORY.forget(run)


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
    return _checked(arrays, like, path.name)


def _checked(arrays: Arrays, like: Mapping[str, np.ndarray], name: str) -> Arrays:
    """``arrays`` when they have ``like``'s keys, shapes and dtypes and finite values, else :class:`CorruptState`."""
    if sorted(arrays) != sorted(like):
        raise CorruptState(f"{name} holds keys {sorted(arrays)[:3]}..., expected the model's")
    for key, ref in like.items():
        value = arrays[key]
        if value.shape != np.shape(ref) or value.dtype != np.asarray(ref).dtype:
            raise CorruptState(
                f"{name}: {key!r} is {value.dtype}{value.shape}, expected {np.asarray(ref).dtype}{np.shape(ref)}"
            )
        if not np.all(np.isfinite(value)):
            raise CorruptState(f"{name}: {key!r} has non-finite values")
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
