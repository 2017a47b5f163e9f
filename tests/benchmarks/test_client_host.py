"""benchmarks/client_host.py end to end on tiny generated data: the three parts per client-round (at 1 round the
differences are noise, so only their form is checked), and the patched functions are restored."""

import json
import math

import pytest

import benchmarks.stacked_sweep as sweep
from benchmarks.client_host import main
from strategies import base

pytestmark = pytest.mark.e2e


def test_the_client_host_benchmark_prints_each_part_and_restores_what_it_timed(capsys):
    aggregate, compose = base.ServerOptStrategy.aggregate_train, sweep.composed
    main(["--model", "logreg", "--rounds", "1"])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"requests", "replies", "aggregate"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())
    assert base.ServerOptStrategy.aggregate_train is aggregate and sweep.composed is compose


def test_bad_rounds_exit_2():
    with pytest.raises(SystemExit) as err:
        main(["--rounds", "0"])
    assert err.value.code == 2
