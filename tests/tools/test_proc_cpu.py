"""tools/proc_cpu.py: process kinds from command lines, the command's exit status passed through, bad usage exit 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from tools.proc_cpu import kind

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "cmdline, expected",
    [
        ("/v/bin/python\0/v/bin/flower-supernode\0--insecure", "SuperNode"),
        ("/v/bin/python\0-m\0flwr_fast supernode", "SuperNode"),
        ("ray::ClientAppActor.run", "Ray workers"),
        ("/v/bin/python\0/v/bin/flwr\0run\0.", "flwr run"),
        ("/v/bin/python\0/v/bin/flwr\0log", "flwr (other)"),
        ("/usr/bin/sleep\0" + "9" * 80, "/usr/bin/sleep " + "9" * 45),  # unknown: its first 60 characters
    ],
)
def test_kind_of_a_command_line(cmdline, expected):
    assert kind(cmdline) == expected


def test_exit_status_of_the_command_and_the_table_on_stderr():
    proc = subprocess.run(
        [sys.executable, "-m", "tools.proc_cpu", "--interval", "0.05", "--", sys.executable, "-c", "exit(3)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 3 and proc.stdout == ""
    assert "s wall; CPU seconds per process kind (lower bounds):" in proc.stderr.splitlines()[0]


@pytest.mark.parametrize("args", [[], ["--interval", "0", "--", "true"]])
def test_bad_usage_is_one_line_and_exit_2(args):
    proc = subprocess.run(
        [sys.executable, "-m", "tools.proc_cpu", *args], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 2 and "give a command after -- and an --interval > 0" in proc.stderr.splitlines()[-1]
