"""``--help`` of the Hydra commands: the parts of ``conf/hydra/help/<command>.yaml`` generated from ``conf/``.

Each command's help template (``hydra/help``, selected in its primary config) calls two OmegaConf resolvers:

- ``${fm_groups:COMMAND}``: the config groups and their options, listed by Hydra's own config loader (what
  ``$APP_CONFIG_GROUPS`` lists), without the groups that do not apply to COMMAND; the current choice is marked;
- ``${fm_settings:COMMAND}``: the composed config (with the command line's overrides) as YAML, without the
  sections that do not apply to COMMAND (interpolations unresolved, their ``$`` doubled for Hydra's template).

OmegaConf resolves the template whenever Hydra composes (a merge dereferences the interpolated string), and Hydra's
listing of the groups costs about a second: both resolvers build their text only when the command line asks for
``--help`` (:func:`help_wanted`), and are a short placeholder otherwise.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any

# what each command ignores: config groups and top-level sections of conf/config.yaml
NOT_FOR = {
    "flower-simulation": {"deploy"},  # SuperLink/SuperNode settings
    "flower-deploy": {"engine", "backend"},  # the in-process engines and Ray's resources
}
ADDED_GROUPS = ("experiment", "method", "sweep")  # presets without a default: +GROUP=OPTION
WIDTH = 116  # characters per line of the group listing
NOT_HELP = "(the command's --help lists this)"  # what the resolvers return when --help was not asked for


def _hydra() -> Any:
    from hydra.core.global_hydra import GlobalHydra

    return GlobalHydra.instance().hydra


def _choices() -> dict[str, Any]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return dict(HydraConfig.get().runtime.choices)
    except ValueError:  # no Hydra config set (composed outside a command)
        return {}


def help_wanted(argv: list[str] | None = None) -> bool:
    """Whether the command line (``sys.argv``, what Hydra parses) asks for ``--help`` / ``-h``."""
    return any(arg in ("--help", "-h") for arg in (sys.argv[1:] if argv is None else argv))


def config_groups(command: str) -> str:
    """``  strategy=   fedavg*, fedavgm, …`` per group of ``conf/`` that applies to ``command`` (* = chosen)."""
    if not help_wanted():
        return NOT_HELP
    hydra = _hydra()
    skip = NOT_FOR.get(command, set())
    groups = [g for g in hydra.list_all_config_groups() if not g.startswith("hydra") and g.split("/")[0] not in skip]
    choices = _choices()
    width = max(len(g) for g in groups) + 2
    lines = []
    for group in sorted(groups, key=lambda g: (g in ADDED_GROUPS, g)):
        options = sorted(hydra.config_loader.get_group_options(group))
        marked = ", ".join(f"{o}*" if choices.get(group) == o else o for o in options)
        name = f"+{group}=" if group in ADDED_GROUPS else f"{group}="
        lines += textwrap.wrap(marked, WIDTH, initial_indent=f"  {name:<{width}} ", subsequent_indent=" " * (width + 3))
    return "\n".join(lines)


def settings(command: str, root: Any) -> str:
    """The composed config as YAML without ``hydra`` and the sections ``command`` ignores."""
    if not help_wanted():
        return NOT_HELP
    from omegaconf import OmegaConf

    skip = NOT_FOR.get(command, set()) | {"hydra"}
    keys = [k for k in root if k not in skip]
    text = OmegaConf.to_yaml(OmegaConf.masked_copy(root, keys)).replace("$", "$$")  # Hydra fills $NAME in
    return "\n".join("  " + line for line in text.rstrip().splitlines())


def register() -> None:
    """Register the resolvers (idempotent); the Hydra commands call it before Hydra composes."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("fm_groups", config_groups, replace=True)
    OmegaConf.register_new_resolver("fm_settings", lambda command, _root_: settings(command, _root_), replace=True)
