"""A pop_gap below zero proves f* wrong (f* = min f): the run says so once, in run.log and on the console."""

import json

from test_batched_engine import make_cfg

from server.batched.grid import BatchedGrid
from server.run.app import run_experiment


def test_an_eval_fstar_above_f_is_warned_once(tiny_data, tmp_path):
    """``eval_fstar=100`` on a problem whose f starts at ln 10 ≈ 2.3: every pop_gap was about -97 and the gap plot
    drew them as "at f* to rounding"; nothing said f* was wrong. An f* below f says nothing."""
    logs = {}
    for name, fstar in (("above", 100.0), ("below", -100.0)):
        run_dir = tmp_path / name
        cfg = make_cfg(
            tiny_data,
            run_dir,
            "model=logreg",
            "engine=batched",
            "eval_train=true",
            "eval_gap=true",
            f"eval_fstar={fstar}",
            "eval_every=1",
            "num_rounds=2",
        )
        run_experiment(BatchedGrid(4), cfg, cfg["run_dir"])
        logs[name] = (run_dir / "run.log").read_text()
        gaps = [json.loads(line)["pop_gap"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert len(gaps) == 3 and all((g < -50) if name == "above" else (g > 50) for g in gaps)
    warned = [line for line in logs["above"].splitlines() if "WARNING pop_gap" in line]
    assert len(warned) == 1, warned  # once, though every round's gap is below zero
    assert "pop_gap -97." in warned[0] and "< 0 at round 0: f there is below f* = 100, so f* is not" in warned[0]
    assert "WARNING pop_gap" not in logs["below"]
