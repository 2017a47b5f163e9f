"""CPU seconds per process kind of a command and everything it starts (docs/benchmarks.md).

    python -m tools.proc_cpu [--interval 0.1] -- python -m pytest -q tests/deploy

Runs the command and samples /proc every ``--interval`` seconds; each process started meanwhile (the command's,
its descendants and the daemons they spawn; processes already running are left out) has its last seen user + system
time summed by kind (its command line: a Flower SuperNode, its warm ClientApp worker and forks, the SuperLink, a
``flwr`` CLI call, a ServerApp, Ray, ...). Processes that live shorter than one interval are missed, and so is the
CPU a process spends after its last sample, so the figures are lower bounds. Linux only; prints a table on
stderr and exits with the command's exit code.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
# (substring of the command line, kind), first match wins
KINDS = (
    ("clientapp-worker", "ClientApp worker + forks"),
    ("flwr_fast supernode", "SuperNode"),
    ("flwr_fast superlink", "SuperLink"),
    ("flower-superlink", "SuperLink"),
    ("flower-supernode", "SuperNode"),
    ("flwr-serverapp", "ServerApp"),
    ("flwr-clientapp", "ClientApp"),
    ("flower-superexec", "SuperExec"),
    ("bin/flwr run", "flwr run"),
    ("bin/flwr ls", "flwr ls"),
    ("bin/flwr supernode", "flwr supernode"),
    ("bin/flwr ", "flwr (other)"),
    ("flower-deploy", "flower-deploy"),
    ("flower-simulation", "flower-simulation"),
    ("ray::", "Ray workers"),
    ("raylet", "Ray daemons"),
    ("gcs_server", "Ray daemons"),
    ("exec(eval(sys.stdin", "pytest-xdist workers"),
    ("pytest", "pytest"),
)


def kind(cmdline: str) -> str:
    """The kind of a process from its command line (NUL-separated as in /proc/PID/cmdline)."""
    text = " ".join(cmdline.split("\0")[:8])
    return next((name for key, name in KINDS if key in text), text[:60] or "?")


def sample(seen: dict[int, tuple[str, float]]) -> None:
    """Record the kind and CPU seconds of every process now alive."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline") as f:
                cmdline = f.read()
        except OSError:
            continue
        if cmdline:
            seen[int(entry)] = (kind(cmdline), (int(fields[11]) + int(fields[12])) / TICK)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between samples of /proc")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command (after --)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.interval <= 0:
        parser.error("give a command after -- and an --interval > 0")
    before: dict[int, tuple[str, float]] = {}
    sample(before)  # processes already running are not the command's
    seen: dict[int, tuple[str, float]] = {}
    t0 = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        sample(seen)
        time.sleep(args.interval)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for pid, (name, cpu) in seen.items():
        if pid not in before:
            totals[name][0] += cpu
            totals[name][1] += 1
    print(f"{time.monotonic() - t0:.1f} s wall; CPU seconds per process kind (lower bounds):", file=sys.stderr)
    for name, (cpu, count) in sorted(totals.items(), key=lambda item: -item[1][0]):
        print(f"{cpu:9.2f} CPU-s {count:5d} processes  {name}", file=sys.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
