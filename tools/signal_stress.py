"""How a signal during Ray's start-up ends ``flower-simulation``: N runs, each signalled a random time after its
Ray session dir appears; counts the runs that did not end with the documented status.

    python -m tools.signal_stress --runs 30 --signal int --max-delay 6 --out /tmp/signal-stress

``int`` sends SIGINT to the run's process group (a terminal's Ctrl-C: Ray's GCS and raylet get it too), ``term``
SIGTERM to the driver only. A run still alive 3.5 s after the signal gets its threads' states, kernel stacks and a
``py-spy dump --native`` (when py-spy is installed) written to ``--out/hang<i>.txt`` before the guard ends it:
that is how the GIL held by Ray's ``wait_for_persisted_port`` was found (server.internals.ray_port_wait). Prints one
line per run and a last line ``RESULT <signal> runs N not-as-documented K``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tools.datagen import make_image_folder
from tools.raytools import BIN, kill_all_with, private_ray_tmp, ray_env, wait_gone
from tools.tiny_run import sim_args


def dump(pid: int, path: Path) -> None:
    """Every thread of ``pid``: state, wchan, kernel stack (root only); then py-spy's view, if installed."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name)):
        try:
            stat = (task / "stat").read_text()
            lines.append(
                f"tid {task.name} {(task / 'comm').read_text().strip()} state {stat[stat.rindex(')') + 2]} "
                f"wchan {(task / 'wchan').read_text()}"
            )
            lines.append((task / "stack").read_text())
        except OSError as err:
            lines.append(f"  ({err})")
    spy = shutil.which("py-spy", path=str(BIN)) or shutil.which("py-spy")
    if spy:
        lines.append(
            subprocess.run(
                [spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=30
            ).stdout
        )
    path.write_text("\n".join(lines))


def one_run(i: int, data: dict, sig: int, max_delay: float, out: Path) -> bool:
    """Start a run, signal it ``U(0, max_delay)`` s after its Ray session dir appears; True if it ended with
    ``128 + sig``, not forced, and left no process."""
    ray_tmp, run_dir = private_ray_tmp(), out / f"run{i}"
    args = sim_args(data, run_dir, "client.local_steps=20", "num_rounds=3")
    proc = subprocess.Popen(
        [str(BIN / "flower-simulation"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ray_env(ray_tmp),
        start_new_session=True,
    )
    while not list((ray_tmp / "ray").glob("session_*")) and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(random.uniform(0, max_delay))
    sent = time.monotonic()
    os.killpg(proc.pid, sig) if sig == signal.SIGINT else os.kill(proc.pid, sig)
    try:
        proc.wait(timeout=3.5)
    except subprocess.TimeoutExpired:
        dump(proc.pid, out / f"hang{i}.txt")
    _, err = proc.communicate(timeout=60)
    took, left = time.monotonic() - sent, wait_gone(str(ray_tmp))
    ok = proc.returncode == 128 + sig and "forced" not in err and not left
    print(i, proc.returncode, f"{took:.1f} s", "left", len(left), "ok" if ok else "NOT AS DOCUMENTED", flush=True)
    if not ok:
        (out / f"err{i}.txt").write_text(err)
    kill_all_with(str(ray_tmp))
    shutil.rmtree(ray_tmp, ignore_errors=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--signal", choices=["int", "term"], default="int")
    parser.add_argument("--max-delay", type=float, default=0.0, help="seconds; 0 = at once (the GCS wait)")
    parser.add_argument("--out", type=Path, default=Path("signal-stress"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = make_image_folder(args.out / "data" / "folder", per_class=8, test_per_class=150, seed=2)
    data = {"tarball": folder, "cache": args.out / "data" / "cache"}
    sig = signal.SIGINT if args.signal == "int" else signal.SIGTERM
    bad = sum(not one_run(i, data, sig, args.max_delay, args.out) for i in range(args.runs))
    print("RESULT", signal.Signals(sig).name, "runs", args.runs, "not-as-documented", bad)


if __name__ == "__main__":
    main()
