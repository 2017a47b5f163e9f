"""benchmarks/host_round.py end to end on tiny generated data: each mode's ms per job-round and its split (host =
the whole minus the stacked step; at 2 rounds the differences are noise, so only their form is checked), and the
client-state write and read of each model."""

import json

import pytest

from benchmarks.host_round import main

pytestmark = pytest.mark.e2e


def test_the_host_benchmark_splits_each_mode_and_times_client_states(tmp_path, capsys):
    main(["--jobs", "2", "--rounds", "2", "--repeats", "1", "--out", str(tmp_path)])
    result = json.loads(capsys.readouterr().out)
    for mode in ("lone_ms_per_job_round", "group_ms_per_job_round"):
        ms = result[mode]
        assert set(ms) == {"whole", "step", "requests", "replies", "host"}
        assert ms["host"] == pytest.approx(ms["whole"] - ms["step"], abs=2e-3)  # each rounded to 1e-3
    states = result["client_state_ms"]
    assert set(states) == {"logreg", "resnet20", "cnn"}
    parts = {"write", "read", "write through a BytesIO", "read through np.load", "keep", "read kept"}
    assert all(set(row) == parts and min(row.values()) > 0 for row in states.values())  # ms to 3 decimals
    cold = result["cold_us"]
    assert set(cold) == {"run.log line", "write: npy.to_array (weight)", "read: npy.to_numpy (weight)"}
    assert all(set(row) == {"warm", "after a pass"} and min(row.values()) > 0 for row in cold.values())
