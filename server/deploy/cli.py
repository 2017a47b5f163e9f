"""``flower-deploy``: the Hydra-configured experiment on Flower's deployment engine (SuperLink + SuperNodes).

    flower-deploy num_rounds=50 data.root=/data/cifar10-jpeg.tar.gz          # local federation, N SuperNodes
    flower-deploy deploy.tls=true deploy.auth=true                          # TLS + SuperNode authentication
    flower-deploy deploy.superlink=10.0.0.5:8000 deploy.spawn_supernodes=0 \
        deploy.root_certificates=certs/ca.crt                               # submit to an existing federation
    flower-deploy resume=true run_dir=outputs/2026-01-01/12-00-00 hydra.run.dir=outputs/2026-01-01/12-00-00

The config is composed and validated exactly as for ``flower-simulation``, then sent to the ServerApp
(``server.deploy.server_app:app``) base64-encoded in the run config key ``config-b64`` through ``flwr run --stream``.
The run writes the same run directory; the deployment's own files (logs, certificates, ``$FLWR_HOME``)
go to ``<run_dir>/deploy``. Every process started here is stopped again, also on Ctrl-C, SIGTERM and failure.
"""

from __future__ import annotations

import json
import logging
import math
import re
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from client import threads
from server.deploy import ownership
from server.deploy.app_stage import stage_app
from server.deploy.federation import LOOPBACK, DeployError, Federation, FederationOptions, RunResult
from server.run import config as config_lib
from server.run import console, hydra_errors, procs, run_lock
from server.run import help as cli_help
from server.run.errors import first_line
from server.run.hydra_config import save_job_record
from server.run.transport import RUN_CONFIG_KEY
from strategies.participation import CyclicSchedule, make_schedule

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
NODE_CONFIG_KEY = re.compile(r"[A-Za-z0-9_-]+")  # keys deploy(node_config=...) may add
RESTART_GRACE = 3.0  # seconds local SuperNodes get to exit after SIGTERM when a memory-state SuperLink restarts
_OPTION_KEYS = (
    "host",
    "address",
    "fleet_port",
    "control_port",
    "superlink",
    "root_certificates",
    "tls",
    "auth",
    "cert_hosts",
    "database",
    "startup_timeout",
    "stop_timeout",
    "fast",
    "poll_interval",
    "supernode_max_wait",
)


def options(deploy: dict[str, Any], num_clients: int | None = None) -> FederationOptions:
    """FederationOptions from the ``deploy`` config group (``database: auto`` resolved by :func:`state_in_file`)."""
    kwargs = {k: deploy[k] for k in _OPTION_KEYS if deploy.get(k) is not None}
    kwargs["cert_hosts"] = [str(h) for h in kwargs.get("cert_hosts", [])]
    kwargs["database"] = state_in_file(deploy, num_clients)
    return FederationOptions(**kwargs)


def node_threads(cfg: dict[str, Any]) -> int:
    """``node_config`` torch-threads of the SuperNodes spawned here (0: none given, torch's default).

    ``deploy.node_threads``: an integer as given; ``auto`` = each node's share of this host's cores,
    max(1, cores // spawned nodes that train in the same round) (:func:`client.threads.local_share`:
    4 nodes with torch's default ran 8 busy threads on 2 cores). ``client.torch_threads`` > 0 overrides it.
    """
    value = cfg["deploy"].get("node_threads", "auto")
    if value != "auto":
        return int(value)
    return threads.local_share(threads.usable_cores(), concurrent_local_nodes(cfg))


def concurrent_local_nodes(cfg: dict[str, Any]) -> int:
    """Most spawned SuperNodes (partitions 0..k-1) one round selects: the largest share of a cyclic group among
    them, or min(k, C*N) under uniform sampling (the config is validated, so the schedule builds)."""
    spawned = int(cfg["deploy"].get("spawn_supernodes", 0) or 0)
    p = cfg["participation"]
    schedule = make_schedule(
        p["mode"], int(cfg["num_clients"]), float(p["fraction"]), int(cfg["seed"]), p.get("groups")
    )
    if isinstance(schedule, CyclicSchedule):
        return max(sum(1 for c in group if c < spawned) for group in schedule.groups)
    return min(spawned, schedule.size)


def state_in_file(deploy: dict[str, Any], num_clients: int | None) -> bool:
    """Whether a spawned SuperLink keeps its state in a file. ``auto``: only when SuperNodes this command does
    not start may join (Fleet API beyond loopback, or fewer spawned SuperNodes than clients): they survive a
    SuperLink restart only with the file. When flower-deploy starts every SuperNode itself, it restarts them
    after a SuperLink restart, and the in-memory state saves ~1 s of SQLite work per round (docs/deploy.md)."""
    value = deploy.get("database", "auto")
    if value != "auto":
        return bool(value)
    spawned = int(deploy.get("spawn_supernodes", 0) or 0)
    return str(deploy.get("host", LOOPBACK)) != LOOPBACK or num_clients is None or spawned < num_clients


def _check_resolves(key: str, value: str) -> None:
    """``deploy.<key>``'s host ``value`` is an address or a name this host resolves (a :class:`ConfigError` naming
    it else)."""
    try:
        socket.getaddrinfo(value, None)
    except (OSError, UnicodeError) as err:
        why = getattr(err, "strerror", None) or type(err).__name__
        raise config_lib.ConfigError(f"'deploy.{key}': {value!r} is no address this host resolves ({why})") from None


def _superlink_address(value: str) -> tuple[str, int]:
    """``deploy.superlink`` as (host, port): HOST:PORT with a port in [1, 65535] (a ConfigError else)."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise config_lib.ConfigError(f"'deploy.superlink' must be HOST:PORT (port 1-65535), got {value!r}")
    return host.strip("[]"), int(port)  # [::1]:9093


def check_superlink_answers(value: str, timeout: float) -> None:
    """A TCP connection to an existing SuperLink's Control API (``deploy.superlink``, validated) opens within
    ``timeout`` seconds (a :class:`DeployError` naming the address and the reason else): checked before ``flwr
    run``, whose own error would come after a retry loop and without the address."""
    host, port = _superlink_address(value)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise DeployError(
            f"nothing answers at deploy.superlink={value} ({why}): start the SuperLink (or the tunnel to its "
            "Control API) first"
        ) from None


def validate_deploy(cfg: dict[str, Any]) -> dict[str, Any]:
    """Check the ``deploy`` group (after :func:`server.run.config.validate`); returns it."""
    d = cfg.get("deploy")
    if not isinstance(d, dict):
        raise config_lib.ConfigError("missing config group 'deploy'")
    spawn = d.get("spawn_supernodes", 0)
    if spawn == "all":  # ${num_clients} of a natural task (num_clients=all), which validate() resolved to a count
        spawn = d["spawn_supernodes"] = int(cfg["num_clients"])
    if isinstance(spawn, bool) or not isinstance(spawn, int) or not 0 <= spawn <= int(cfg["num_clients"]):
        raise config_lib.ConfigError(f"'deploy.spawn_supernodes' must be in [0, num_clients], got {spawn!r}")
    for key in ("tls", "auth", "fast", "bind_partitions"):
        if d.get(key) is not None and not isinstance(d[key], bool):
            raise config_lib.ConfigError(f"'deploy.{key}' must be true or false, got {d[key]!r}")
    if d.get("auth") and not (d.get("tls") or d.get("root_certificates")):
        raise config_lib.ConfigError("'deploy.auth' needs 'deploy.tls=true' (Flower requires TLS for node auth)")
    if d.get("superlink") is not None and (d.get("tls") or d.get("auth")):
        raise config_lib.ConfigError(
            "'deploy.tls'/'deploy.auth' configure a spawned SuperLink; for an existing "
            "one set 'deploy.root_certificates' and register nodes with its operator"
        )
    for key in ("fleet_port", "control_port", "max_restarts"):
        value = d.get(key, 0)
        top = 65535 if key.endswith("port") else math.inf
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
            within = "in [0, 65535]" if key.endswith("port") else ">= 0"
            raise config_lib.ConfigError(f"'deploy.{key}' must be an integer {within}, got {value!r}")
    for key in ("run_timeout", "startup_timeout", "stop_timeout", "supernode_max_wait"):
        value = d.get(key, 0)
        low_ok = value > 0 if key == "startup_timeout" else value >= 0
        if isinstance(value, bool) or not isinstance(value, int | float) or not (low_ok and value < math.inf):
            bound = "> 0" if key == "startup_timeout" else ">= 0"
            raise config_lib.ConfigError(f"'deploy.{key}' must be a finite number {bound} (seconds), got {value!r}")
    hosts = d.get("cert_hosts") or []
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise config_lib.ConfigError(f"'deploy.cert_hosts' must be a list of host names or IPs, got {hosts!r}")
    if d.get("superlink") is not None:
        _check_resolves("superlink", _superlink_address(str(d["superlink"]))[0])
    else:  # what this host binds and what its SuperNodes dial must resolve
        _check_resolves("host", str(d.get("host", LOOPBACK)))
        if spawn:
            _check_resolves("address", str(d.get("address", LOOPBACK)))
    poll = d.get("poll_interval", 0.5)
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0 < poll <= 3:
        raise config_lib.ConfigError(f"'deploy.poll_interval' must be in (0, 3] seconds, got {poll!r}")
    threads_value = d.get("node_threads", "auto")
    if threads_value != "auto" and (
        isinstance(threads_value, bool) or not isinstance(threads_value, int) or threads_value < 0
    ):
        raise config_lib.ConfigError(f"'deploy.node_threads' must be auto or an integer >= 0, got {threads_value!r}")
    if d.get("database", "auto") not in (True, False, "auto"):
        raise config_lib.ConfigError(f"'deploy.database' must be true, false or auto, got {d['database']!r}")
    if d.get("root_certificates") and not Path(str(d["root_certificates"])).expanduser().is_file():
        raise config_lib.ConfigError(f"'deploy.root_certificates': no file at {d['root_certificates']}")
    if d.get("app_dir") and not Path(str(d["app_dir"])).expanduser().is_dir():
        raise config_lib.ConfigError(f"'deploy.app_dir': no folder at {d['app_dir']} (the Flower app to deploy)")
    ownership.check(cfg)
    return d


def deploy(
    cfg: dict[str, Any],
    on_line: Callable[[str], None] = print,
    on_start: Callable[[Federation], None] | None = None,
    node_config: dict[int, dict[str, str]] | None = None,
    on_valid: Callable[[], None] | None = None,
) -> RunResult:
    """Validate ``cfg``, start the federation, submit the run (resuming after a SuperLink crash), stop everything.

    ``on_valid`` is called once ``cfg`` is valid, before any process starts (the command writes the job's Hydra
    record then); ``on_start`` is called with the running federation before the first submission (tests use it);
    ``node_config`` adds ``key="value"`` pairs to the ``--node-config`` of the spawned SuperNode of a partition
    from its first start on (kept for restarts; the ClientApp reads them from its context).
    """
    remote = (cfg.get("deploy") or {}).get("superlink") is not None
    cfg = config_lib.validate(cfg, check_paths=not remote)  # a remote ServerApp checks data.root on its host
    d = validate_deploy(cfg)
    check_node_config(node_config, int(d.get("spawn_supernodes", 0) or 0))
    if on_valid is not None:
        on_valid()
    if not remote:  # the ServerApp reads the data here: decoded once now, a bad image one line before any process
        from server.run.data import server_dataset

        server_dataset(cfg)
    else:
        check_superlink_answers(str(d["superlink"]), min(10.0, float(d.get("startup_timeout", 60))))
    run_dir = Path(cfg["run_dir"]).resolve()
    cfg["run_dir"] = str(run_dir)
    try:  # what flwr run packs, without walking .venv at every submission (server/deploy/app_stage.py)
        app_dir = stage_app(Path(d.get("app_dir") or ROOT), run_dir / "deploy" / "app")
    except Exception as err:  # no pyproject.toml, a broken one, an unreadable file: before any process starts
        raise config_lib.ConfigError(
            f"'deploy.app_dir': cannot pack {d.get('app_dir') or ROOT} as a Flower app: {first_line(err)}"
        ) from None
    opts = options(d, int(cfg["num_clients"]))
    opts.torch_threads = node_threads(cfg)  # what each SuperNode spawned here is told
    fed = Federation(run_dir / "deploy", app_dir, opts)
    fed.on_notice = on_line
    fed.extra_node_config.update({int(p): dict(extra) for p, extra in (node_config or {}).items()})
    # SIGINT too: a shell starts a background job with SIGINT ignored, and Python then installs no handler
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    result: RunResult | None = None
    try:
        if fed.spawn:
            fed.start_superlink()
            fed.start_supernodes(int(d["spawn_supernodes"]), int(cfg["num_clients"]), d.get("data_root"))
        _set_partition_owners(cfg, fed)
        _write_pids(fed)
        if on_start is not None:
            on_start(fed)
        restarts = 0
        while True:
            result = fed.submit({RUN_CONFIG_KEY: config_lib.encode(cfg)}, on_line, float(d.get("run_timeout") or 0))
            if result.status != "superlink-lost" or restarts >= int(d.get("max_restarts", 0)):
                break
            restarts += 1
            on_line(
                f"flower-deploy: SuperLink lost (run {result.run_id}); restart {restarts}, "
                f"resuming from the last checkpoint in {run_dir}"
            )
            _restart_superlink(fed)
            cfg["resume"] = True
        return result
    except KeyboardInterrupt:
        if result is None and not fed.spawn and fed.cli:
            on_line("flower-deploy: interrupted; asking the SuperLink to stop the run")
            run_id = _last_run_id(fed)
            if run_id is not None:
                fed.stop_run(run_id)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        left = fed.stop()
        if left:
            on_line(f"flower-deploy: WARNING processes still alive after stop: {left}")


def check_node_config(node_config: dict[int, dict[str, str]] | None, spawned: int) -> None:
    """``deploy``'s ``node_config``: partitions of SuperNodes spawned here, keys of letters, digits, ``-`` and
    ``_``, string values without a double quote (they go into ``--node-config key="value"``); a ConfigError
    otherwise, before any process starts."""
    for partition, extra in (node_config or {}).items():
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < spawned:
            raise config_lib.ConfigError(
                f"node_config: partition {partition!r} has no SuperNode spawned here "
                f"(deploy.spawn_supernodes={spawned})"
            )
        for key, value in extra.items():
            if not isinstance(key, str) or not NODE_CONFIG_KEY.fullmatch(key):
                raise config_lib.ConfigError(
                    f"node_config: partition {partition}: key {key!r} must be letters, digits, '-' or '_'"
                )
            if not isinstance(value, str) or '"' in value:
                raise config_lib.ConfigError(
                    f"node_config: partition {partition}: value of {key!r} must be a string without '\"', got {value!r}"
                )


def _set_partition_owners(cfg: dict[str, Any], fed: Federation) -> None:
    """``deploy.partition_owners`` for the ServerApp: key fingerprint -> partition of the SuperNodes spawned here
    (auth) and of the operator's ``deploy.partition_keys``; absent when partitions are not owned by keys."""
    d = cfg["deploy"]
    d.pop("partition_owners", None)  # only ever what this function computes
    listed = ownership.check(cfg)
    spawned = {p: fed.node_keys[f"node{p}"].public for p in fed.supernodes} if fed.spawn and fed.options.auth else {}
    if spawned or listed is not None:
        d["partition_owners"] = ownership.owners_map(spawned, listed)


def _restart_superlink(fed: Federation) -> None:
    """Start the SuperLink again on the same ports and bring the local SuperNodes back.

    With the state in a file (``deploy.database``) the SuperNodes keep their IDs and reconnect by themselves
    (those that gave up meanwhile are started again); with the state in memory the new SuperLink knows none of
    them, so every local SuperNode is stopped (SIGTERM, SIGKILL ~``RESTART_GRACE`` s later) and started again
    (after re-registering its key).
    """
    fed.start_superlink()
    if not fed.options.database:
        if fed.options.auth:  # registrations lived in the lost in-memory state
            fed.register_keys_again()
        procs.stop_all(fed.supernodes.values(), RESTART_GRACE)  # doomed: all at once, a short grace
    else:
        try:
            fed.wait_nodes(len(fed.supernodes), timeout=20)
        except DeployError:
            pass
    fed.restart_supernodes([p for p, proc in fed.supernodes.items() if not proc.alive()])
    _write_pids(fed)


def _write_pids(fed: Federation) -> None:
    """<run_dir>/deploy/pids.json: PIDs of the SuperLink and SuperNodes (for operators and tests)."""
    pids = {
        "superlink": fed.superlink.pid if fed.superlink else None,
        "supernodes": {str(k): p.pid for k, p in fed.supernodes.items()},
        "control_address": fed.control_address,
        "fleet_address": fed.fleet_address,
    }
    (fed.workdir / "pids.json").write_text(json.dumps(pids, indent=1))


def _last_run_id(fed: Federation) -> int | None:
    from server.deploy.federation import RUN_ID

    text = (fed.log_dir / "flwr-run.log").read_text() if (fed.log_dir / "flwr-run.log").exists() else ""
    found = RUN_ID.findall(text)
    return int(found[-1]) if found else None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


cli_help.register()  # the resolvers of the --help template (conf/hydra/help/flower_deploy.yaml)


# conf/flower_deploy.yaml: conf/config.yaml with this command's --help
@hydra.main(config_path=str(CONF_DIR), config_name="flower_deploy", version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    root = logging.getLogger()  # Flower's lines arrive through the stream; keep Hydra's file handler only
    for handler in [h for h in root.handlers if type(h) is logging.StreamHandler]:
        root.removeHandler(handler)
    console.quiet_job_log(bool(cfg.get("verbose", False)))  # cli.log without other libraries' chatter
    try:
        plain = config_lib.to_plain(cfg)
        plain["run_dir"] = config_lib.make_run_dir(plain["run_dir"])
        run_lock.check_layout(plain["run_dir"], folders=("deploy",))  # the deployment's app, logs and state
        result = deploy(plain, on_line=lambda line: print(line, flush=True), on_valid=lambda: save_job_record(cfg))
    except config_lib.ConfigError as err:
        print(f"flower-deploy: invalid configuration: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except DeployError as err:
        print(f"flower-deploy: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except KeyboardInterrupt:
        print("flower-deploy: interrupted; all processes stopped", file=sys.stderr)
        raise SystemExit(130) from None
    if not result.ok:
        logs = Path(plain["run_dir"]) / "deploy" / "logs"
        if result.run_id is None:  # flwr run failed before the SuperLink took the run: its own error is above
            print(
                f"flower-deploy: the run was not submitted: flwr run failed (its output: {logs}/flwr-run.log)",
                file=sys.stderr,
            )
        else:
            print(
                f"flower-deploy: run {result.run_id} ended with status {result.status!r}{_failure(plain['run_dir'])} "
                f"(logs in {logs})",
                file=sys.stderr,
            )
        raise SystemExit(1)
    summary_path = Path(plain["run_dir"]) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    summary.setdefault("run_dir", plain["run_dir"])
    print(console.summary_line("flower-deploy", plain, summary, result.seconds, run_id=result.run_id), flush=True)


def _failure(run_dir: str) -> str:
    """': <reason>' when the ServerApp recorded why it failed (status.json), else ''."""
    path = Path(run_dir) / "status.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    return f": {record.get('reason')}" if record.get("status") == "failed" and record.get("reason") else ""


def main() -> None:
    """Console entry point."""
    with hydra_errors.composition_errors("flower-deploy"):
        _hydra_main()
