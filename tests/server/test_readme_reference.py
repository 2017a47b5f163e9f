"""The README's configuration reference against conf/: every option of every config group (conf/<group>/*.yaml)
and every key of conf/config.yaml is listed, and nothing listed is gone from conf/. The checker is checked too:
it must notice an option or a key taken out of the reference."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
HEADING = "## Configuration reference (`conf/`)"
TICKED = re.compile(r"`([^`]+)`")
GROUP_CELL = re.compile(r"^`\+?([a-z_/]+)=`$")


def reference_section(readme: str) -> str:
    """The text of the README's configuration reference, up to the next level-2 heading."""
    start = readme.index(HEADING)
    end = readme.find("\n## ", start + len(HEADING))
    return readme[start : end if end >= 0 else len(readme)]


def _rows(section: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| `")
    ]


def listed_options(section: str) -> dict[str, set[str]]:
    """{group: options} of the group table: rows whose first cell is `group=` or `+group=`."""
    groups: dict[str, set[str]] = {}
    for cells in _rows(section):
        found = GROUP_CELL.match(cells[0])
        if found:
            groups.setdefault(found.group(1), set()).update(TICKED.findall(cells[1]))
    return groups


def listed_keys(section: str) -> set[str]:
    """Dotted keys of the settings table; `a.b` / `c` lists a.b and a.c."""
    keys: set[str] = set()
    for cells in _rows(section):
        if GROUP_CELL.match(cells[0]):
            continue
        prefix = ""
        for token in TICKED.findall(cells[0]):
            if "." in token:
                prefix = token.rsplit(".", 1)[0] + "."
                keys.add(token)
            else:
                keys.add(prefix + token)
    return keys


def conf_options(conf: Path) -> dict[str, set[str]]:
    """{group: options} of conf/: every YAML file below a group folder (the files at the top are primary configs)."""
    groups: dict[str, set[str]] = {}
    for path in conf.rglob("*.yaml"):
        rel = path.relative_to(conf)
        if len(rel.parts) > 1:
            groups.setdefault("/".join(rel.parts[:-1]), set()).add(path.stem)
    return groups


def conf_keys(conf: Path) -> set[str]:
    """The keys of conf/config.yaml: top-level ones, and one level down in its own sections (client, trust, …)."""
    config = yaml.safe_load((conf / "config.yaml").read_text())
    keys = {k for k in config if k != "defaults"}
    for key, value in config.items():
        if isinstance(value, dict) and key not in ("defaults", "hydra"):
            keys |= {f"{key}.{sub}" for sub in value}
    return keys


def problems(section: str, conf: Path = CONF) -> list[str]:
    """What the reference misses or lists in excess of conf/ (empty: it matches)."""
    listed, present = listed_options(section), conf_options(conf)
    found = []
    for group in sorted(present.keys() | listed.keys()):
        found += [f"missing option {group}={o}" for o in sorted(present.get(group, set()) - listed.get(group, set()))]
        found += [
            f"listed but not in conf/: {group}={o}"
            for o in sorted(listed.get(group, set()) - present.get(group, set()))
        ]
    keys = listed_keys(section)
    for key in sorted(conf_keys(conf)):
        top = key.split(".")[0]
        if key not in keys and f"{top}.*" not in keys and not any(k.startswith(key + ".") for k in keys):
            found.append(f"missing key {key}")
    return found


def test_the_reference_lists_every_group_option_and_key():
    assert problems(reference_section((ROOT / "README.md").read_text())) == []


def test_the_reference_counts_every_model_and_dataset():
    groups = listed_options(reference_section((ROOT / "README.md").read_text()))
    assert len(groups["model"]) == len(list((CONF / "model").glob("*.yaml"))) == 8
    assert len(groups["data"]) == len(list((CONF / "data").glob("*.yaml"))) == 7


def test_the_checker_notices_a_missing_option_and_key():
    section = reference_section((ROOT / "README.md").read_text())
    assert ", `resnet18`" in section and "| `verbose` |" in section
    without_option = section.replace(", `resnet18`", "", 1)
    assert problems(without_option) == ["missing option model=resnet18"]
    without_key = "\n".join(line for line in section.splitlines() if not line.startswith("| `verbose` |"))
    assert problems(without_key) == ["missing key verbose"]
    without_nested = "\n".join(
        line for line in section.splitlines() if not line.startswith("| `trust.max_update_norm`")
    )
    assert problems(without_nested) == ["missing key trust.max_update_norm"]


def test_the_checker_notices_an_option_that_conf_lacks(tmp_path):
    section = reference_section((ROOT / "README.md").read_text())
    conf = tmp_path / "conf"
    for path in CONF.rglob("*.yaml"):
        if path.name != "so_lstm.yaml":
            target = conf / path.relative_to(CONF)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text())
    assert problems(section, conf) == ["listed but not in conf/: model=so_lstm"]
