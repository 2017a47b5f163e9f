"""Writers shared by all experiments: Markdown table, CSV, JSON and PNG plots in an output directory."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def fmt(value: Any) -> str:
    """Compact cell text: floats in %.3g (or %.2e for tiny/huge), bools as yes/no, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0.0 or (1e-3 <= abs(value) < 1e4):
            return f"{value:.4g}"
        return f"{value:.2e}" if math.isfinite(value) else str(value)
    return str(value)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as a GitHub Markdown table with the given column order."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_outputs(
    outdir: str | os.PathLike,
    name: str,
    rows: Sequence[dict[str, Any]],
    payload: dict[str, Any],
    columns: Sequence[str] | None = None,
    notes: Sequence[str] = (),
) -> dict[str, str]:
    """Write ``name``.md (table + notes), ``name``.csv (rows) and ``name``.json (payload); return the paths."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    columns = list(columns or (rows[0].keys() if rows else []))
    md = f"# {name}\n\n" + markdown_table(rows, columns)
    if notes:
        md += "\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    paths = {"md": str(out / f"{name}.md"), "csv": str(out / f"{name}.csv"), "json": str(out / f"{name}.json")}
    Path(paths["md"]).write_text(md)
    with open(paths["csv"], "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c) for c in columns})
    Path(paths["json"]).write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    return paths


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


def new_figure(ncols: int = 1, width: float = 5.0, height: float = 3.6):
    """A matplotlib figure on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, outdir: str | os.PathLike, name: str) -> str:
    import matplotlib.pyplot as plt

    path = Path(outdir) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
