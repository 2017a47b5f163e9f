"""A multirun's programs side by side in worker processes (``hydra.launcher.processes=P``).

Each unit of work (a group's jobs as one program, or a job that runs alone) runs in a spawned process, at most ``P``
at a time. A process is pinned to its share of the cores (``cores // P``, at least one) and its program uses those
cores only. Within a program the jobs' Python (requests, replies, metrics) runs one job at a time, so on a CPU
programs in processes of their own do that work side by side (measured in docs/benchmarks.md "Stacked sweeps").
Each process holds its own copy of the data: ``P`` times a program's memory.

A process that ends without reporting (killed, e.g. by the kernel's out-of-memory killer) fails the jobs it ran with
one line naming each; the other processes go on. Its jobs' run directories are what a killed lone run leaves:
``resume=true`` continues them. The parent stops its processes when it is stopped (:mod:`server.run.stop` ends a
run's descendants); a process ignores Ctrl-C itself, so a terminal's SIGINT is handled once, by the parent.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Sequence
from logging import WARNING
from multiprocessing.connection import Connection, wait
from typing import Any

from flwr.common.logger import log

from server.batched.workers import available_cores

PROCESS_NAME = "stacked-program-"


def core_sets(processes: int) -> list[list[int]]:
    """The cores of each of ``processes`` slots: this process's cores in equal contiguous shares (at least one core
    each; shares are reused round-robin when there are more slots than cores)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning, each slot gets a share's count of threads
        cores = list(range(available_cores()))
    share = max(1, len(cores) // processes)
    sets = [cores[s * share : (s + 1) * share] for s in range(len(cores) // share)]
    return [sets[p % len(sets)] for p in range(processes)]


def _main(conn: Connection, work: Callable[..., dict[int, Any]], unit: tuple[str, list[int]], runs: list[Any],
          share: bool | None, cores: list[int]) -> None:  # fmt: skip
    """A worker process: ``work(kind, runs, indices, share)`` on ``cores``; sends its {index: outcome}."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and ends this process
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    import torch

    from server.run.cli import console_to_flower

    torch.set_num_threads(len(cores))
    console_to_flower()
    conn.send(work(unit[0], runs, unit[1], share))
    conn.close()


def run_units(
    units: Sequence[tuple[str, list[int]]],
    runs: Sequence[Any],
    processes: int,
    share: bool | None,
    work: Callable[..., dict[int, Any]],
    outcome: Callable[[str, str, str], Any],
) -> dict[int, Any]:
    """{job index: outcome} of every unit (("group", indices) or ("lone", [index])), ``processes`` at a time, each
    by ``work(kind, runs, indices, share)`` in its process (a module-level function: it is sent by name); a job
    whose process ended without reporting gets ``outcome(run_dir, "error", message)``."""
    context = multiprocessing.get_context("spawn")  # not fork: the parent's OpenMP threads do not survive a fork
    slots = core_sets(processes)
    free = list(range(processes))
    waiting = list(enumerate(units))
    running: dict[Any, tuple[Any, Connection, tuple[str, list[int]], int]] = {}  # by the process's sentinel
    reported: dict[Any, dict[int, Any]] = {}  # what each running process sent, by its sentinel
    outcomes: dict[int, Any] = {}
    try:
        while waiting or running:
            while waiting and free:
                number, unit = waiting.pop(0)
                slot = free.pop(0)
                receive, send = context.Pipe(duplex=False)
                args = (send, work, unit, [runs[i] for i in unit[1]], share, slots[slot])
                proc = context.Process(target=_main, args=args, name=f"{PROCESS_NAME}{number}", daemon=True)
                proc.start()
                send.close()  # the child holds the sending end
                running[proc.sentinel] = (proc, receive, unit, slot)
            readers = {entry[1]: sentinel for sentinel, entry in running.items() if sentinel not in reported}
            for ready in wait([*running, *readers]):
                if ready in readers:  # read as soon as sent: a large report must not block the sender's exit
                    if readers[ready] in running:
                        reported[readers[ready]] = _receive(ready)
                    continue
                proc, receive, unit, slot = running.pop(ready)
                sent = reported.pop(ready, None)
                sent = _receive(receive) if sent is None else sent
                proc.join()
                receive.close()
                free.append(slot)
                for i in unit[1]:
                    outcomes[i] = sent.get(i) or _lost(i, runs[i].values["run_dir"], proc.exitcode, outcome)
    finally:
        for proc, receive, _, _ in running.values():
            proc.terminate()
            proc.join()
            receive.close()
    return outcomes


def _receive(conn: Connection) -> dict[int, Any]:
    """What a process sent (nothing when it ended first)."""
    try:
        return conn.recv() if not conn.closed and conn.poll() else {}
    except (EOFError, OSError):
        return {}


def _lost(index: int, run_dir: str, exitcode: int | None, outcome: Callable[[str, str, str], Any]) -> Any:
    """The outcome of a job whose process ended without reporting, said in one line."""
    message = f"job {index} ({run_dir}): its process {_ended(exitcode)} before it finished; resume=true continues it"
    log(WARNING, "[stacked] %s", message)
    return outcome(run_dir, "error", message)


def _ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        why = " (the kernel's out-of-memory killer sends it)" if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{why}"
    return f"exited with code {exitcode}"
