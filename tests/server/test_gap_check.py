"""A pop_gap below zero proves f* wrong (f* = min f): the run says so once, in run.log and on the console."""

import json

import numpy as np
from test_batched_engine import make_cfg

from server.batched.grid import BatchedGrid
from server.report import run_plots
from server.run.app import run_experiment


def test_an_eval_fstar_above_f_is_warned_once(tiny_data, tmp_path, monkeypatch):
    """``eval_fstar=100`` on a problem whose f starts at ln 10 ≈ 2.3: every pop_gap was about -97 and the gap plot
    drew them as "at f* to rounding"; nothing said f* was wrong. An f* below f says nothing."""
    marks, real = {}, run_plots.gap_marks  # f* gap.png was drawn with -> (within rounding, below) masks of its gaps

    def spy(gaps, f_star):
        marks[f_star] = real(gaps, f_star)
        return marks[f_star]

    monkeypatch.setattr(run_plots, "gap_marks", spy)
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
            "plots=true",
        )
        run_experiment(BatchedGrid(4), cfg, cfg["run_dir"])
        logs[name] = (run_dir / "run.log").read_text()
        assert (run_dir / "gap.png").stat().st_size > 0
        gaps = [json.loads(line)["pop_gap"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert len(gaps) == 3 and all((g < -50) if name == "above" else (g > 50) for g in gaps)
    warned = [line for line in logs["above"].splitlines() if "WARNING pop_gap" in line]
    assert len(warned) == 1, warned  # once, though every round's gap is below zero
    assert "pop_gap -97." in warned[0] and "< 0 at round 0: f there is below f* = 100, so f* is not" in warned[0]
    assert "WARNING pop_gap" not in logs["below"]
    rounding, below = marks[100.0]  # drawn as "f* is wrong", not as rounding
    assert below.all() and not rounding.any()
    assert not any(m.any() for m in marks[-100.0])  # every gap positive: no marks


def test_gap_marks_tell_rounding_from_a_wrong_f_star():
    gaps = np.array([0.5, 1e-3, 0.0, -1e-12, -1.5e-9, -97.0])
    rounding, below = run_plots.gap_marks(gaps, 1.6)  # tolerance 1.6e-9, the run's own check
    assert rounding.tolist() == [False, False, True, True, True, False]
    assert below.tolist() == [False, False, False, False, False, True]
    rounding, below = run_plots.gap_marks(gaps, None)  # f* unknown: 1e-9
    assert below.tolist() == [False, False, False, False, True, True]
