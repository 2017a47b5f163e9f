"""server/run/window.py: the last W server models, their float64 mean, and the checkpoint round trip."""

import numpy as np
import pytest

from server.run.window import PREFIX, ModelWindow, split_arrays


def model(value, steps=0):
    return {"w": np.full((2, 3), value, dtype=np.float32), "steps": np.array(steps, dtype=np.int64)}


def test_mean_of_the_last_w_models_in_float64_integer_buffers_from_the_newest():
    window = ModelWindow(3)
    for rnd, value in enumerate([1.0, 2.0, 4.0, 0.1], start=1):
        window.push(rnd, model(value, steps=rnd))
        assert window.full() == (rnd >= 3)
    assert window.rounds == [2, 3, 4]
    mean = window.mean()
    assert mean["w"].dtype == np.float64 and np.all(mean["w"] == (2.0 + 4.0 + float(np.float32(0.1))) / 3)
    assert mean["steps"].dtype == np.int64 and mean["steps"] == 4


def test_push_keeps_a_copy_not_the_callers_array():
    window, arrays = ModelWindow(1), model(1.0)
    window.push(1, arrays)
    arrays["w"][:] = 9.0
    assert np.all(window.mean()["w"] == 1.0)


def test_checkpoint_round_trip_and_a_smaller_window_keeps_the_newest():
    window = ModelWindow(3)
    for rnd in (5, 6, 7):
        window.push(rnd, model(float(rnd)))
    rounds, arrays = window.state()
    assert rounds == [5, 6, 7] and all(key.startswith(PREFIX) for key in arrays)
    strategy_part, window_part = split_arrays({"model/w": np.zeros(1), **arrays})
    assert list(strategy_part) == ["model/w"] and window_part.keys() == arrays.keys()
    again = ModelWindow(3)
    again.load(rounds, window_part)
    assert again.rounds == [5, 6, 7] and np.array_equal(again.mean()["w"], window.mean()["w"])
    smaller = ModelWindow(2)
    smaller.load(rounds, window_part)
    assert smaller.rounds == [6, 7] and np.all(smaller.mean()["w"] == 6.5)


@pytest.mark.parametrize("rounds", [[], [3], [1, 3]])
def test_a_window_with_too_few_or_non_consecutive_rounds_is_not_full(rounds):
    window = ModelWindow(2)
    for rnd in rounds:
        window.push(rnd, model(1.0))
    assert not window.full()


def test_size_zero_keeps_nothing():
    window = ModelWindow(0)
    window.push(1, model(1.0))
    assert window.rounds == [] and not window.full() and window.state() == ([], {})


def test_check_refuses_a_window_that_does_not_fit_the_model():
    window = ModelWindow(2)
    window.push(1, model(1.0))
    window.check(model(0.0))
    rounds, arrays = window.state()
    arrays.pop(f"{PREFIX}0/steps")  # a damaged checkpoint
    damaged = ModelWindow(2)
    damaged.load(rounds, arrays)
    with pytest.raises(ValueError, match="round 1 does not match"):
        damaged.check(model(0.0))
    with pytest.raises(ValueError, match="does not match"):
        window.check({"w": np.zeros((3, 2), dtype=np.float32), "steps": np.array(0)})
