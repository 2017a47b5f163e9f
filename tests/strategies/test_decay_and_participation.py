"""Plateau decay rule (seed 001 Section 9) and participation schedules (seed 000 Assumption III.3)."""

import itertools
import json

import pytest

from strategies import schedules
from strategies.participation import CyclicSchedule, UniformSchedule, clients_per_round, make_schedule


def run_decay(values, config, client_lr=1.0, server_lr=1.0):
    state = schedules.PlateauDecayState.start(client_lr, server_lr, config)
    decays, lrs = [], []
    for t, v in enumerate(values, start=1):
        before = state.num_decays
        state = schedules.plateau_decay_step(state, v, config)
        if state.num_decays > before:
            decays.append(t)
        lrs.append((state.client_lr, state.server_lr))
    return decays, lrs, state


def test_scripted_losses_decay_exactly_where_the_rule_says():
    # Hand trace (W=2, P=2, C=1, Delta=0): r1 window [inf,5] -> wait 1 (cooldown ran out this round);
    # r2 avg 4.5 best; r3 avg 4 best; r4 wait 1; r5 wait 2 -> decay; r6 cooldown -> wait 1; r7 decay;
    # r8 avg 2.5 best; r9 avg 1 best; r10 wait 1; r11 decay.
    config = schedules.PlateauDecayConfig(window=2, patience=2, cooldown=1, min_delta=0.0)
    decays, lrs, _ = run_decay([5, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1], config)
    assert decays == [5, 7, 11]
    assert lrs[-1][0] == pytest.approx(1e-3)
    assert lrs[-1][1] == pytest.approx(0.9**3)
    assert lrs[3] == (1.0, 1.0)


def test_default_knobs_first_decays_at_rounds_200_and_399():
    # Cooldown covers rounds 1..100 (best set at 100 when the window fills), wait reaches P=100 at 200;
    # after a decay the cooldown of 100 rounds ends at 300, where waiting restarts: 300 + 99 = 399.
    decays, _, _ = run_decay([2.0] * 450, schedules.PlateauDecayConfig())
    assert decays == [200, 399]


def test_min_delta_counts_small_improvements_as_plateau():
    config = schedules.PlateauDecayConfig(window=1, patience=3, cooldown=0, min_delta=0.5)
    decays, _, _ = run_decay([10, 9.9, 9.8, 9.7, 9.6], config)
    assert decays == [4]


def test_decay_floors_at_min_lr_and_state_serialises():
    config = schedules.PlateauDecayConfig(window=1, patience=1, cooldown=0, min_delta=0.0, min_lr=0.05)
    _, lrs, state = run_decay([1.0] * 30, config, client_lr=1.0, server_lr=0.1)
    assert [c for c, _ in lrs][:3] == pytest.approx([1.0, 0.1, 0.05])
    assert min(s for _, s in lrs) == pytest.approx(0.05)
    restored = schedules.PlateauDecayState(**json.loads(json.dumps(vars(state))))
    assert restored == state


@pytest.mark.parametrize(
    "bad",
    [
        dict(window=0),
        dict(patience=0),
        dict(cooldown=-1),
        dict(client_decay=0.0),
        dict(server_decay=1.5),
        dict(min_delta=-1.0),
        dict(min_lr=-1.0),
    ],
)
def test_decay_config_rejects_bad_knobs(bad):
    name = next(iter(bad))
    with pytest.raises(ValueError, match=name):
        schedules.PlateauDecayConfig(**bad)


def test_cyclic_groups_are_disjoint_covering_periodic_and_seeded():
    s = CyclicSchedule(100, 0.1, seed=7)
    assert s.period == 10
    flat = list(itertools.chain.from_iterable(s.groups))
    assert sorted(flat) == list(range(100)) and all(len(g) == 10 for g in s.groups)
    for t in range(11, 60):
        assert s.clients_for_round(t) == s.clients_for_round(t - s.period)  # S^t = S^{t-p}
        for k in range(t - s.period + 1, t):
            assert not set(s.clients_for_round(k)) & set(s.clients_for_round(t))
    assert CyclicSchedule(100, 0.1, seed=7).groups == s.groups
    assert CyclicSchedule(100, 0.1, seed=8).groups != s.groups


def test_cyclic_explicit_groups_and_errors():
    s = CyclicSchedule(4, 0.5, groups=[[0, 2], [1, 3]])
    assert [s.clients_for_round(t) for t in (1, 2, 3)] == [[0, 2], [1, 3], [0, 2]]
    with pytest.raises(ValueError, match="groups"):
        CyclicSchedule(4, 0.5, groups=[[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="fraction"):
        CyclicSchedule(10, 0.3)
    with pytest.raises(ValueError, match="fraction"):
        CyclicSchedule(10, 0.4)  # 4 clients per round, but 10 is not 2.5 groups
    with pytest.raises(ValueError, match="fraction"):
        clients_per_round(100, 0.0)


def test_uniform_is_without_replacement_and_reproducible():
    s = UniformSchedule(20, 0.25, seed=3)
    rounds = [s.clients_for_round(t) for t in range(1, 30)]
    assert all(len(r) == 5 == len(set(r)) for r in rounds)
    assert rounds == [UniformSchedule(20, 0.25, seed=3).clients_for_round(t) for t in range(1, 30)]
    assert len({tuple(r) for r in rounds}) > 20
    with pytest.raises(ValueError, match="mode"):
        make_schedule("random", 20, 0.25)
