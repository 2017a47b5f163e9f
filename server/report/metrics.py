"""A run directory's per-round metrics: ``metrics.csv`` and ``metrics.jsonl``, written as produced
(:class:`MetricsWriter`) and read back (:func:`read_metrics`, :func:`parse_metrics`); the plots of them are
:mod:`server.report.run_plots`.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

COLUMNS = (
    "round",
    "accuracy",
    "loss",
    "server_lr",
    "client_lr",
    "seconds",
    "train_loss",
    "loss_before",
    "num_selected",
    "num_replies",
    "num_rejected",
    "num_failures",
    "num_skipped",
    "update_norm",
    "client_update_norm",
    "pop_loss",
    "pop_accuracy",
    "elapsed",
    "num_refused",
    "num_reassigned",
    "num_silent",
    "pop_gap",
    "avg_accuracy",
    "avg_loss",
    "avg_pop_loss",
    "avg_pop_accuracy",
    "avg_pop_gap",  # eval_average: mean of last W
)


class MetricsWriter:
    """Appends one row per round to metrics.csv and metrics.jsonl, flushing each row to disk; both files stay open
    until :meth:`close`."""

    def __init__(self, run_dir: Path, keep_rounds_upto: int | None = None) -> None:
        self.csv_path = run_dir / "metrics.csv"
        self.jsonl_path = run_dir / "metrics.jsonl"
        rows, broken = parse_metrics(self.jsonl_path) if keep_rounds_upto is not None else ([], [])
        if broken:  # e.g. a row cut short by a kill: the rows are rewritten without it
            logging.getLogger("flwr").warning(
                "%s: %d line(s) that are no metrics row left out (line %d first)",
                self.jsonl_path,
                len(broken),
                broken[0],
            )
        rows = [r for r in rows if keep_rounds_upto is not None and r["round"] <= keep_rounds_upto]
        self._rewrite(rows)  # drop rows past the checkpoint a resumed run starts from
        self.rows = rows
        self._csv = open(self.csv_path, "a", newline="")  # noqa: SIM115 - open for the run, closed by close()
        self._jsonl = open(self.jsonl_path, "a")  # noqa: SIM115
        self._csv_rows = csv.DictWriter(self._csv, fieldnames=COLUMNS)

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Both files as ``rows``, each replaced whole (a kill or a full disk meanwhile leaves the earlier rows)."""
        for path, write in ((self.csv_path, _write_csv), (self.jsonl_path, _write_jsonl)):
            tmp = path.with_name(f".{path.name}.tmp")
            try:
                with open(tmp, "w", newline="") as f:
                    write(f, rows)
            except OSError:
                tmp.unlink(missing_ok=True)
                raise
            os.replace(tmp, path)

    def append(self, row: dict[str, Any]) -> None:
        """Write one round's metrics to both files now."""
        self.rows.append(row)
        self._csv_rows.writerow({k: _fmt(row.get(k)) for k in COLUMNS})
        self._csv.flush()
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()

    def close(self) -> None:
        """Close both files (every row is already on disk); no row can be appended after."""
        self._csv.close()
        self._jsonl.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gap_tolerance(f_star: float) -> float:
    """How far below 0 a ``pop_gap`` = f(x) − f* may lie by rounding: 1e-9, relative to |f*| when larger (the solver
    leaves ~1e-13). f* = min f, so a gap below −tolerance means f* is not the run's minimum."""
    return 1e-9 * max(1.0, abs(f_star))


def _fmt(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def _write_csv(f: Any, rows: list[dict[str, Any]]) -> None:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows({k: _fmt(r.get(k)) for k in COLUMNS} for r in rows)


def _write_jsonl(f: Any, rows: list[dict[str, Any]]) -> None:
    f.writelines(json.dumps(r) + "\n" for r in rows)


class BrokenMetrics(ValueError):
    """A line of metrics.jsonl that is no metrics row (a JSON object with an integer ``round`` past the previous
    row's, every other value a number or null)."""


def read_metrics(run_dir: Path | str) -> list[dict[str, Any]]:
    """Rows of a run's metrics.jsonl (empty when absent); a line that is no metrics row raises
    :class:`BrokenMetrics` naming the file and the line."""
    path = Path(run_dir) / "metrics.jsonl"
    rows, broken = parse_metrics(path)
    if broken:
        raise BrokenMetrics(f"{path}: line {broken[0]} is no metrics row ({len(broken)} such line(s))")
    return rows


def parse_metrics(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """(the metrics rows of a metrics.jsonl, the numbers of its lines that are none); ([], []) when absent. A row
    whose round is not past the previous row's (a second row of a round) is none: a report would count it twice."""
    if not path.exists():
        return [], []
    rows: list[dict[str, Any]] = []
    broken: list[int] = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if _is_row(row) and (not rows or row["round"] > rows[-1]["round"]):
            rows.append(row)
        else:
            broken.append(number)
    return rows, broken


def _is_row(row: Any) -> bool:
    return (
        isinstance(row, dict)
        and _is_number(row.get("round"), int)
        and row["round"] >= 0
        and all(value is None or _is_number(value, int | float) for value in row.values())
    )


def _is_number(value: Any, kind: Any) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)
