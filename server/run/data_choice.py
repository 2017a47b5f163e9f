"""Which CIFAR-10 ``make run`` uses, so that it works on a fresh machine too.

    python -m server.run.data_choice --data "$(DATA)" --shared "$(SHARED_DATA)" -- $(ARGS)

prints the Hydra overrides on stdout (one per line, for ``flower-simulation``) and says on stderr, as the
first line of the run, which source it chose. In order:

1. ``ARGS`` already choose the data (``data=...`` or ``data.root=...``): nothing is added;
2. ``DATA`` (the make variable), then ``$FEDMOMENTUM_DATA``: that ImageFolder tree or .tar.gz;
3. the local copy ``--shared`` (make: ``SHARED_DATA``) when it exists;
4. otherwise torchvision's CIFAR-10, downloaded once into ``~/.cache/fedmomentum/torchvision``
   (``data=cifar10 data.download=true``; a failed download ends the run with one line, exit 2).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

DOWNLOAD = ["data=cifar10", "data.download=true"]


def choose(
    data: str, shared: str | os.PathLike, args: Sequence[str] = (), env: dict[str, str] | None = None
) -> tuple[list[str], str]:
    """(overrides, one-line explanation) for ``make run``."""
    env = os.environ if env is None else env
    if any(a.split("=", 1)[0].lstrip("+~") in ("data", "data.root", "data.name") for a in args):
        return [], "data: as given in ARGS"
    if data:
        return [f"data.root={Path(data).expanduser().absolute()}"], f"data: {data} (DATA)"
    if env.get("FEDMOMENTUM_DATA"):
        return [f"data.root={env['FEDMOMENTUM_DATA']}"], f"data: {env['FEDMOMENTUM_DATA']} ($FEDMOMENTUM_DATA)"
    shared = Path(shared).expanduser().absolute()
    if shared.exists():
        return [f"data.root={shared}"], f"data: {shared} (SHARED_DATA, the local copy)"
    return list(DOWNLOAD), (
        f"data: no copy at {shared}: CIFAR-10 from torchvision, downloaded once (170 MB) into "
        "~/.cache/fedmomentum/torchvision (make run DATA=<folder or .tar.gz> to use your own)"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="", help="the DATA make variable (empty = choose)")
    parser.add_argument("--shared", required=True, help="the local copy used when it exists (make: SHARED_DATA)")
    parser.add_argument("args", nargs="*", help="the ARGS make variable (Hydra overrides)")
    opts = parser.parse_args(argv)
    overrides, why = choose(opts.data, opts.shared, opts.args)
    print(f"make run: {why}", file=sys.stderr, flush=True)
    print("\n".join(overrides))


if __name__ == "__main__":
    main()
