"""Client participation schedules over partition ids (pure, no Flower).

Cyclic participation (paper 1 Assumption III.3): the N clients are split into
p = 1/C disjoint groups; group ((t - 1) mod p) trains at round t, so S^t = S^{t-p}
and consecutive rounds inside a period never share a client. Uniform participation
samples C*N clients without replacement each round. Both are deterministic functions
of (seed, round), so a resumed run, a simulation and a deployment with the same seed
select the same partitions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def clients_per_round(num_clients: int, fraction: float) -> int:
    """C*N as an exact integer; a fraction that does not split the clients is an error."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"participation.fraction must lie in (0, 1], got {fraction}")
    size = num_clients * fraction
    if abs(size - round(size)) > 1e-9 or round(size) < 1:
        raise ValueError(
            f"participation.fraction={fraction} does not split {num_clients} clients evenly "
            f"({num_clients} x {fraction} = {size:g} is not a positive integer)"
        )
    return int(round(size))


class CyclicSchedule:
    """Cyclic participation with period p = 1/C (paper 1 Assumption III.3).

    Groups are a seeded random split of ``range(num_clients)`` into p equal parts, or
    ``groups`` given explicitly (disjoint, covering all clients).
    """

    def __init__(
        self,
        num_clients: int,
        fraction: float,
        seed: int = 0,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> None:
        if groups is not None:
            if (
                isinstance(groups, str | bytes)
                or not isinstance(groups, Sequence)
                or not all(isinstance(g, Sequence) and not isinstance(g, str | bytes) and _ids(g) for g in groups)
            ):
                raise ValueError(f"participation.groups must be lists of integer client ids, got {groups!r}")
            self.groups = [sorted(int(c) for c in g) for g in groups]
            flat = [c for g in self.groups for c in g]
            if sorted(flat) != list(range(num_clients)) or any(len(g) == 0 for g in self.groups):
                raise ValueError("participation.groups must be non-empty, disjoint and cover every client id 0..N-1")
        else:
            size = clients_per_round(num_clients, fraction)
            period = 1.0 / fraction
            if abs(period - round(period)) > 1e-9 or num_clients % size:
                raise ValueError(
                    f"participation.fraction={fraction}: cyclic participation needs 1/C to be an integer "
                    f"number of equal groups of {num_clients} clients"
                )
            order = np.random.default_rng(seed).permutation(num_clients)
            self.groups = [sorted(int(c) for c in order[k : k + size]) for k in range(0, num_clients, size)]
        self.num_clients = num_clients
        self.period = len(self.groups)

    def clients_for_round(self, server_round: int) -> list[int]:
        """S^t: the partition ids of group ((t - 1) mod p)."""
        return list(self.groups[(server_round - 1) % self.period])


class UniformSchedule:
    """C*N partition ids drawn uniformly without replacement, from a generator seeded by (seed, t)."""

    def __init__(self, num_clients: int, fraction: float, seed: int = 0) -> None:
        self.num_clients = num_clients
        self.size = clients_per_round(num_clients, fraction)
        self.seed = seed

    def clients_for_round(self, server_round: int) -> list[int]:
        """S^t for round t (independent of the rounds before, so resumes are exact)."""
        rng = np.random.default_rng([self.seed, server_round])
        return sorted(int(c) for c in rng.choice(self.num_clients, size=self.size, replace=False))


def make_schedule(
    mode: str,
    num_clients: int,
    fraction: float,
    seed: int = 0,
    groups: Sequence[Sequence[int]] | None = None,
) -> CyclicSchedule | UniformSchedule:
    """Build the schedule named by ``mode`` ("cyclic" or "uniform")."""
    if mode == "cyclic":
        return CyclicSchedule(num_clients, fraction, seed, groups)
    if mode == "uniform":
        if groups is not None:  # it would be ignored: uniform draws S^t afresh every round
            raise ValueError("participation.groups are cyclic groups; participation.mode=uniform draws its own")
        return UniformSchedule(num_clients, fraction, seed)
    raise ValueError(f"participation mode must be 'cyclic' or 'uniform', got {mode!r}")


def _ids(group: Sequence[object]) -> bool:
    """Whether every entry of ``group`` is an integer (not a bool, not a float such as 1.5)."""
    return all(isinstance(c, int | np.integer) and not isinstance(c, bool) for c in group)
