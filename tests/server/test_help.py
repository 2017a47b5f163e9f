"""Every console script's --help: plain text (no RST markup) that says what the command does; the Hydra commands
(conf/hydra/help/) list their config groups with every option of conf/, five examples, where results go, and none
of the settings of the other command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
BIN = Path(sys.executable).parent
SCRIPTS = ("flower-simulation", "flower-deploy", "flower-plot", "flower-theory", "flower-report", "flower-optimum")


def help_text(name: str) -> str:
    proc = subprocess.run([str(BIN / name), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return proc.stdout


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_pyproject_scripts_are_the_ones_tested():
    text = (ROOT / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]")[1].split("\n[")[0]
    assert sorted(re.findall(r"^([\w-]+) =", scripts, re.M)) == sorted(SCRIPTS)


def _listed_groups(block: str) -> dict[str, list[str]]:
    """{group: sorted options} of a help's group listing (an option list may wrap onto indented lines)."""
    listed: dict[str, list[str]] = {}
    group = None
    for line in block.splitlines()[1:]:
        found = re.match(r"  \+?([\w/]+)=\s+(.*)", line)
        if found:
            group, rest = found.groups()
        elif group and line.startswith("    "):
            rest = line
        else:
            continue
        listed.setdefault(group, []).extend(o.strip().rstrip("*") for o in rest.split(",") if o.strip())
    return {g: sorted(options) for g, options in listed.items()}


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_is_plain_text(name):
    text = help_text(name)
    assert "`" not in text and ":mod:" not in text and ":func:" not in text, text
    assert name in text.splitlines()[0] or f"usage: {name}" in text


@pytest.mark.parametrize(
    "name, says, other",
    [
        (
            "flower-simulation",
            "flower-simulation: run a federated-learning experiment in simulation.",
            ("deploy=", "deploy:", "spawn_supernodes", "superlink"),
        ),
        (
            "flower-deploy",
            "flower-deploy: run the experiment of flower-simulation on Flower's deployment engine",
            ("engine=", "engine:", "backend:", "num_gpus", "chunk_size"),
        ),
    ],
)
def test_hydra_help_describes_the_command(name, says, other):
    text = help_text(name)
    assert text.startswith(says) and "powered by Hydra" not in text
    groups = text.split("Config groups")[1].split("Examples:")[0]
    listed = _listed_groups(groups)
    for group in ("strategy", "model", "data", "participation", "experiment", "method", "sweep"):
        assert listed[group] == _options(group), group
    assert re.search(r"  strategy=\s+fedavg\*", groups) and re.search(r"  model=.* cnn\*", groups)
    examples = text.split("Examples:\n")[1].split("\n\n")[0].splitlines()
    assert len(examples) == 5 and all(e.startswith(f"  {name}") for e in examples), examples
    assert "Results: the run directory (hydra.run.dir" in text and "metrics.csv" in text and "run.log" in text
    assert "Settings" in text and "num_rounds: 10" in text and "verbose: false" in text
    for setting in other:
        assert setting not in text, setting


def test_hydra_help_follows_the_command_line():
    proc = subprocess.run(
        [str(BIN / "flower-simulation"), "strategy=fedcm", "num_rounds=7", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"  strategy=.* fedcm\*", proc.stdout) and "num_rounds: 7" in proc.stdout


def test_the_help_listing_is_built_only_for_help(monkeypatch):
    """OmegaConf resolves the help template on every compose: without --help the resolvers return a placeholder
    and never ask Hydra for its groups (no Hydra is set up here: asking would raise)."""
    from hydra.core.global_hydra import GlobalHydra

    from server.run import help as cli_help

    GlobalHydra.instance().clear()
    monkeypatch.setattr(sys, "argv", ["flower-simulation", "num_rounds=3", "model.name=-h"])
    assert not cli_help.help_wanted()
    assert cli_help.config_groups("flower-simulation") == cli_help.NOT_HELP
    assert cli_help.settings("flower-simulation", {"num_rounds": 3}) == cli_help.NOT_HELP
    assert cli_help.help_wanted(["num_rounds=3", "--help"]) and cli_help.help_wanted(["-h"])
    monkeypatch.setattr(sys, "argv", ["flower-simulation", "--help"])
    with pytest.raises(AttributeError):  # the real listing: it asks the (absent) Hydra for its groups
        cli_help.config_groups("flower-simulation")
