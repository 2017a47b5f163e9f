"""Bad input is a one-line error before any heavy import: the CLIs' config checks load neither torch nor Ray
(a bad-config exit takes ~0.5 s instead of ~3 s; docs/benchmarks.md, issue 18)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "datasets")


@pytest.mark.parametrize(
    "argv",
    [
        ["server.run.cli", "num_clients=-1"],  # flower-simulation
        ["server.run.cli", "data.root=/nonexistent/cifar.tar.gz"],
        ["server.deploy.cli", "num_clients=-1"],  # flower-deploy
        ["server.convex.cli", "model=cnn"],  # flower-optimum
        ["server.convex.cli", "model=logreg", "client.weight_decay=-1"],
    ],
)
def test_a_bad_config_exits_2_without_heavy_imports(argv, tmp_path):
    module, *args = argv
    code = (
        f"import sys; sys.argv = ['cli', *{args!r}]\n"
        f"from {module} import main\n"
        "try:\n    main()\nexcept SystemExit as end:\n"
        f"    loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "    print('exit', end.code, 'loaded', loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.stdout.strip().splitlines()[-1] == "exit 2 loaded []", out.stdout + out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("variable, value", [("FEDMOMENTUM_TF32", "yes"), ("FEDMOMENTUM_DEVICE", "gpu")])
def test_a_bad_environment_variable_exits_2_naming_it(variable, value, tmp_path):
    """$FEDMOMENTUM_TF32 / $FEDMOMENTUM_DEVICE (client/environment.py) are checked with the config: one line, exit 2,
    before torch is imported."""
    code = (
        "import sys; sys.argv = ['cli', 'num_clients=4']\n"
        "from server.run.cli import main\n"
        "try:\n    main()\nexcept SystemExit as end:\n"
        f"    loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "    print('exit', end.code, 'loaded', loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), variable: value},
    )
    assert out.stdout.strip().splitlines()[-1] == "exit 2 loaded []", out.stdout + out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and f"${variable}" in out.stderr and repr(value) in out.stderr
