"""The deployed ServerApp (``server.deploy.server_app:app``): the round loop of :mod:`server.run.app` behind a
SuperLink. ``flower-deploy`` submits the run's config base64-encoded in the run config key ``config-b64``."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.deploy import flwr_fast
from server.run import config as config_lib
from server.run.app import run_experiment

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Deployment entry: the config arrives base64-encoded in the run config key ``config-b64``."""
    encoded = str(context.run_config.get("config-b64", ""))
    if not encoded:
        raise config_lib.ConfigError("run config key 'config-b64' is empty: submit runs with flower-deploy")
    cfg = config_lib.decode(encoded)
    if (cfg.get("deploy") or {}).get("fast", True):  # short retries when a reply's objects are still uploading
        flwr_fast.patch_object_pulls(flwr_fast.SERVERAPP_GRID)
    run_experiment(grid, cfg, cfg["run_dir"])
