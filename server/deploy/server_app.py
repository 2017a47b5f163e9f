"""The deployed ServerApp (``server.deploy.server_app:app``): the round loop of :mod:`server.run.app` behind a
SuperLink. ``flower-deploy`` submits the run's config base64-encoded in the run config key ``config-b64``."""

from __future__ import annotations

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server.internals.flower_object_pulls import patch_serverapp_object_pulls
from server.run import config as config_lib
from server.run.app import run_experiment
from server.run.config import RunConfig
from server.run.transport import RUN_CONFIG_KEY

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Deployment entry: the config arrives base64-encoded in the run config key ``config-b64``."""
    encoded = str(context.run_config.get(RUN_CONFIG_KEY, ""))
    if not encoded:
        raise config_lib.ConfigError("run config key 'config-b64' is empty: submit runs with flower-deploy")
    run_cfg = RunConfig.from_dict(config_lib.decode(encoded))  # validated here, on the ServerApp's host
    cfg = run_cfg.values
    if (cfg.get("deploy") or {}).get("fast", True):  # short retries when a reply's objects are still uploading
        patch_serverapp_object_pulls()
    run_experiment(grid, run_cfg, cfg["run_dir"])
