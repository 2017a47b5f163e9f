"""Stacked chunks that run out of the device's memory: recognised, halved until they fit, and the error of a client
that does not fit alone.

``engine.chunk_size=auto`` sizes chunks from an estimate (:func:`server.batched.engine.chunk_size`); when a chunk
still runs out of memory, :func:`server.batched.grid.fitting_results` trains it again in halves (each client's
computation is its own, so its results do not depend on its chunk) and the engine stacks at most the size that fit
from then on. A single client that does not fit is a configuration this device cannot run: the run (in a stacked
group, that job only) fails with :class:`ClientDoesNotFit`, one line naming the model, the batch size and the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from logging import WARNING

import torch
from flwr.common.logger import log

from server.run.errors import ConfigError

# what torch's CPU and MPS allocators say when an allocation fails (CUDA raises torch.OutOfMemoryError)
ALLOCATOR_MESSAGES = (
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
    "MPS backend out of memory",
)


class ClientDoesNotFit(ConfigError):
    """One client's stacked training does not fit the device's memory."""


@dataclass
class OutOfMemory:
    """What the stacked training of a chunk that ran out of memory gives: the allocator's first line."""

    error: str


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation failure of torch's CUDA, CPU or MPS allocator."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err) for m in ALLOCATOR_MESSAGES)


def release(device: torch.device) -> None:
    """Hand the allocator's cached blocks back after an out-of-memory error (CUDA)."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def smaller_chunks(current: int | None, chunks: list[list[tuple[int, bool]]], device: torch.device) -> int | None:
    """The chunk size to stack from now on, given the (clients, fit) of the parts each of a round's chunks was
    trained in: ``current`` when every chunk was trained whole, else the most clients that fit in one part (said
    once, in a line)."""
    if all(len(parts) == 1 for parts in chunks):
        return current
    size = max((n for parts in chunks for n, fit in parts if fit), default=1)
    if current is not None and size >= current:
        return current
    log(WARNING, "[batched] stacking at most %d clients at a time from now on (a chunk ran out of %s memory)", size,
        device)  # fmt: skip
    return size


def does_not_fit(model: str, batch_size: int, device: torch.device, error: str) -> ClientDoesNotFit:
    return ClientDoesNotFit(
        f"'client.batch_size': one client of {model} with batches of {batch_size} does not fit in the memory of "
        f"{device} even alone ({error}); lower client.batch_size"
    )
