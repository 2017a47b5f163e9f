"""Fast checks of the deployment pieces that need no running federation."""

from __future__ import annotations

import io
import ipaddress
import shutil
import socket
import zipfile

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_ssh_private_key, load_ssh_public_key
from deploy_helpers import ROOT, compose, overrides, run_cli

from server.deploy.app_stage import stage_app
from server.deploy.cli import concurrent_local_nodes, deploy, node_threads, state_in_file, validate_deploy
from server.deploy.federation import DeployError
from server.deploy.tls import make_node_key, make_tls
from server.run import config as config_lib


def test_certificates_chain_and_san(tmp_path):
    files = make_tls(tmp_path, ["sl.example.org", "10.0.0.5"])
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"sl.example.org", "localhost"}
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("10.0.0.5"),
        ipaddress.ip_address("127.0.0.1"),
    }
    assert files.server_key.stat().st_mode & 0o077 == 0


def test_node_keys_are_openssh_ecdsa(tmp_path):
    key = make_node_key(tmp_path, "node0")
    assert key.public.read_text().startswith("ecdsa-sha2-nistp384 ")
    private = load_ssh_private_key(key.private.read_bytes(), password=None)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert load_ssh_public_key(key.public.read_bytes()).public_numbers() == private.public_key().public_numbers()


def test_fab_is_small_and_holds_the_apps(tmp_path):
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(ROOT)
    names = zipfile.ZipFile(io.BytesIO(fab)).namelist()
    assert len(fab) < 2 * 1024 * 1024  # Flower's limit is 10 MB
    assert {
        "server/run/app.py",
        "server/deploy/server_app.py",
        "client/app.py",
        "strategies/flower.py",
        "conf/config.yaml",
    } <= set(names)
    assert not [n for n in names if n.startswith((".venv/", "outputs/", "multirun/"))]
    # flower-deploy packs a staged copy (server/deploy/app_stage.py): the same files, byte for byte
    staged = build_fab_from_disk(stage_app(ROOT, tmp_path / "app"))
    with zipfile.ZipFile(io.BytesIO(fab)) as a, zipfile.ZipFile(io.BytesIO(staged)) as b:
        assert sorted(a.namelist()) == sorted(b.namelist()) and a.read(".info/CONTENT") == b.read(".info/CONTENT")


def test_an_app_dir_that_is_no_flower_app_is_one_line_before_any_process(tmp_path, deploy_data):
    run_dir = tmp_path / "run"
    (tmp_path / "empty").mkdir()
    proc = run_cli("flower-deploy", overrides(deploy_data, run_dir, f"deploy.app_dir={tmp_path / 'empty'}"), timeout=60)
    assert proc.returncode == 2 and proc.stdout.strip().splitlines()[-1].startswith(
        "flower-deploy: invalid configuration: 'deploy.app_dir': cannot pack"
    ), proc.stdout
    assert not (run_dir / "deploy" / "logs").exists()


def test_a_run_dir_of_another_run_keeps_its_hydra_record_and_is_one_line(tmp_path, deploy_data):
    """Hydra wrote the job's .hydra/ before any check: a refused deployment replaced the earlier run's record."""
    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    record = {"metrics.jsonl": '{"round": 0, "loss": 2.3}\n', ".hydra/overrides.yaml": "- seed=7\n"}
    for name, text in record.items():
        (run_dir / name).write_text(text)
    proc = run_cli("flower-deploy", overrides(deploy_data, run_dir), timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]  # stderr comes with stdout here
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert lines[0].startswith(f"flower-deploy: invalid configuration: 'run_dir': {run_dir} holds an earlier run's")
    assert {name: (run_dir / name).read_text() for name in record} == record
    assert sorted(p.name for p in (run_dir / ".hydra").iterdir()) == ["overrides.yaml"]


def test_hydras_own_errors_are_one_line_before_any_process(tmp_path, deploy_data):
    run_dir = tmp_path / "run"
    proc = run_cli("flower-deploy", overrides(deploy_data, run_dir, "model=nope"), timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]  # stderr comes with stdout here
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert lines[0].startswith("flower-deploy: invalid configuration: Could not find 'model/nope' (options: ")
    assert not (run_dir / "deploy").exists()


def test_an_image_that_cannot_be_decoded_is_one_line_before_any_process(tmp_path, deploy_data):
    folder = tmp_path / "folder"
    shutil.copytree(deploy_data["folder"], folder)
    image = sorted((folder / "test").rglob("*.*"))[0]
    image.write_bytes(b"not an image")
    run_dir = tmp_path / "run"
    data = {"folder": folder, "cache": tmp_path / "cache"}
    proc = run_cli("flower-deploy", overrides(data, run_dir), timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]  # stderr comes with stdout here
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert lines[0].startswith(f"flower-deploy: invalid configuration: 'data.root': {image.relative_to(folder)} cannot")
    assert not (run_dir / "deploy").exists()


def test_a_file_where_the_deployment_writes_its_folder_is_one_line_before_any_process(tmp_path, deploy_data):
    """It was "cannot pack <the project> as a Flower app: Not a directory: <run_dir>/deploy/app"."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "deploy").write_text("")
    proc = run_cli("flower-deploy", overrides(deploy_data, run_dir), timeout=60)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]  # stderr comes with stdout here
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout
    assert lines[0] == (
        f"flower-deploy: invalid configuration: 'run_dir': {run_dir / 'deploy'} is not a folder, and the run writes "
        "its deploy there: move it away or choose another run_dir"
    )


@pytest.mark.parametrize(
    "node_config, message",
    [
        ({4: {"gate": "/tmp/g"}}, "partition 4 has no SuperNode"),
        ({-1: {"gate": "/tmp/g"}}, "partition -1 has no SuperNode"),
        ({"0": {"gate": "/tmp/g"}}, "partition '0' has no SuperNode"),
        ({0: {"gate key": "x"}}, "key 'gate key' must be"),
        ({0: {"gate": 'a" misbehave="scale'}}, "value of 'gate' must be"),
        ({0: {"gate": 3}}, "value of 'gate' must be"),
    ],
)
def test_broken_node_config_is_one_error_before_any_process(tmp_path, deploy_data, node_config, message):
    """``deploy(cfg, node_config=...)``: a partition not spawned here, a key or a value that would not survive
    ``--node-config key="value"`` is a ConfigError before anything is staged or started."""
    run_dir = tmp_path / "run"
    cfg = compose(overrides(deploy_data, run_dir))
    with pytest.raises(config_lib.ConfigError, match=message):
        deploy(cfg, node_config=node_config)
    assert not (run_dir / "deploy").exists()


def test_an_existing_superlink_that_does_not_answer_is_one_line_before_anything_is_staged(tmp_path, deploy_data):
    """``flwr run`` to a SuperLink that is not there printed Flower's box after its retries, then "run None ended
    with status 'cli-failed'"; now one line naming the address, before anything is staged or started."""
    run_dir = tmp_path / "run"
    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        cfg = compose(overrides(deploy_data, run_dir, f"deploy.superlink={address}", "deploy.spawn_supernodes=0"))
        with pytest.raises(
            DeployError, match=f"nothing answers at deploy.superlink={address} \\(Connection refused\\)"
        ):
            deploy(cfg)
    assert not (run_dir / "deploy").exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["deploy.auth=true"], "deploy.auth"),
        (["deploy.spawn_supernodes=5"], "spawn_supernodes"),
        (["deploy.superlink=nohostport", "deploy.spawn_supernodes=0"], "HOST:PORT"),
        (["deploy.superlink=h:1", "deploy.tls=true"], "existing"),
        (
            ["deploy.superlink=127.0.0.1:0", "deploy.spawn_supernodes=0"],
            r"HOST:PORT \(port 1-65535\), got '127.0.0.1:0'",
        ),
        (
            ["deploy.superlink=nohost.invalid:9093", "deploy.spawn_supernodes=0"],
            "'deploy.superlink': 'nohost.invalid' is no address this host resolves",
        ),
        (["deploy.root_certificates=/nonexistent/ca.crt"], "root_certificates"),
        (["deploy.fleet_port=-1"], "fleet_port"),
        (["deploy.fleet_port=70000"], r"'deploy.fleet_port' must be an integer in \[0, 65535\], got 70000"),
        (["deploy.max_restarts=0.5"], "'deploy.max_restarts' must be an integer >= 0"),
        (["deploy.run_timeout=nan"], "'deploy.run_timeout' must be a finite number >= 0"),
        (["deploy.stop_timeout=inf"], "'deploy.stop_timeout' must be a finite number >= 0"),
        (["deploy.startup_timeout=0"], "'deploy.startup_timeout' must be a finite number > 0"),
        (["deploy.cert_hosts=notalist"], "'deploy.cert_hosts' must be a list"),
        (["deploy.host=999.1.1.1"], "'deploy.host': '999.1.1.1' is no address this host resolves"),
        (["deploy.address=nohost.invalid"], "'deploy.address': 'nohost.invalid' is no address this host resolves"),
        (["deploy.database=sometimes"], "deploy.database"),
        (["deploy.node_threads=-1"], "deploy.node_threads"),
        (["deploy.node_threads=many"], "deploy.node_threads"),
        # it was Flower's "pyproject.toml not found in files. It may have been excluded by .gitignore"
        (["deploy.app_dir=/nonexistent/app"], r"^'deploy.app_dir': no folder at /nonexistent/app \(the Flower app"),
    ],
)
def test_deploy_config_is_validated(tmp_path, deploy_data, extra, message):
    cfg = config_lib.validate(compose(overrides(deploy_data, tmp_path / "run", *extra)))  # data.root is checked
    with pytest.raises(config_lib.ConfigError, match=message):
        validate_deploy(cfg)


@pytest.mark.parametrize(
    "extra, concurrent",
    [
        (["num_clients=4", "participation.fraction=1.0"], 4),  # the setting: every node trains at once
        (["num_clients=4", "participation.fraction=0.25"], 1),  # one node per round: it may use every core
        (["num_clients=8", "participation.fraction=0.5", "deploy.spawn_supernodes=2"], 2),  # 2 local of 4 per round
        (["num_clients=4", "participation.groups=[[0,1,2],[3]]"], 3),  # explicit cyclic groups: the largest
        (["participation=uniform", "num_clients=10", "participation.fraction=0.2"], 2),
        (["participation=uniform", "num_clients=10", "participation.fraction=0.5", "deploy.spawn_supernodes=3"], 3),
    ],
)
def test_concurrent_local_nodes(tmp_path, extra, concurrent):
    """Spawned SuperNodes a round selects at most; ``auto`` gives each max(1, cores // that)."""
    from client.threads import local_share, usable_cores

    cfg = compose([f"run_dir={tmp_path}", "data.root=x", *extra])
    assert concurrent_local_nodes(cfg) == concurrent
    assert node_threads(cfg) == local_share(usable_cores(), concurrent)
    for value in (0, 3):  # an explicit count is passed on as it is (0: no node_config key, torch's default)
        assert node_threads({**cfg, "deploy": {**cfg["deploy"], "node_threads": value}}) == value


@pytest.mark.parametrize(
    "deploy, in_file",
    [
        ({"database": "auto", "spawn_supernodes": 4, "host": "127.0.0.1"}, False),  # every SuperNode is ours
        ({"database": "auto", "spawn_supernodes": 3, "host": "127.0.0.1"}, True),  # others may join on loopback
        ({"database": "auto", "spawn_supernodes": 4, "host": "0.0.0.0"}, True),  # ... or from other hosts
        ({"database": True, "spawn_supernodes": 4, "host": "127.0.0.1"}, True),
        ({"database": False, "spawn_supernodes": 0, "host": "0.0.0.0"}, False),
    ],
)
def test_superlink_state_in_file(deploy, in_file):
    """``deploy.database=auto`` keeps the state in a file only when SuperNodes not started here may join."""
    assert state_in_file(deploy, num_clients=4) is in_file


def _keys_file(tmp_path, lines: list[str]):
    path = tmp_path / "partition-keys.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "lines, message",
    [
        (["2 {k2}", "3"], "line 2: expected '<partition-id>"),
        (["2 {k2}", "x {k3}"], "line 2: expected"),
        (["2 {k2}", "4 {k3}"], r"line 2: partition 4 is outside \[2, 4\)"),
        (["1 {k2}", "3 {k3}"], r"line 1: partition 1 is outside \[2, 4\) \(0..1: SuperNodes spawned here"),
        (["2 {k2}", "3 {k2}"], "line 2: key SHA256:.* already serves partition 2"),
        (["2 {k2}", "2 {k3}"], "line 2: partition 2 already has a key"),
        (["2 {k2}", "3 ecdsa-sha2-nistp384 AAAAnotbase64"], "line 2: not an OpenSSH public key"),
        (["2 {k2}", "3 SHA256:short"], "line 2: 'SHA256:short' is not a SHA256 key fingerprint"),
        (["2 {k2}"], r"gives no key for partitions \[3\]"),
    ],
)
def test_partition_keys_file_errors_are_one_line(tmp_path, deploy_data, lines, message):
    """deploy.partition_keys: every malformed file is a one-line ConfigError before any process starts."""
    keys = {f"k{i}": make_node_key(tmp_path / "keys", f"n{i}").public.read_text().strip() for i in (2, 3)}
    path = _keys_file(tmp_path, [line.format(**keys) for line in lines])
    cfg = config_lib.validate(
        compose(
            overrides(
                deploy_data,
                tmp_path / "run",
                "deploy.tls=true",
                "deploy.auth=true",
                "deploy.spawn_supernodes=2",
                f"deploy.partition_keys={path}",
            )
        )
    )
    with pytest.raises(config_lib.ConfigError, match=message) as err:
        validate_deploy(cfg)
    assert "\n" not in str(err.value)


def test_partition_keys_file_accepts_keys_and_fingerprints(tmp_path, deploy_data):
    from server.deploy import ownership
    from strategies.claims import key_fingerprint

    k2, k3 = (make_node_key(tmp_path / "keys", f"n{i}").public.read_text().strip() for i in (2, 3))
    path = _keys_file(tmp_path, ["# partition key", f"2 {k2} node2@host", "", f"3 {key_fingerprint(k3)}  # fp"])
    base = overrides(deploy_data, tmp_path / "run", "deploy.tls=true", "deploy.auth=true", "deploy.spawn_supernodes=2")
    cfg = config_lib.validate(compose([*base, f"deploy.partition_keys={path}"]))
    validate_deploy(cfg)
    assert ownership.check(cfg) == {key_fingerprint(k2): 2, key_fingerprint(k3): 3}
    with pytest.raises(config_lib.ConfigError, match="partition_keys"):  # auth, partitions not spawned, no file
        validate_deploy(config_lib.validate(compose(base)))
    no_auth = config_lib.validate(
        compose(overrides(deploy_data, tmp_path / "run", f"deploy.partition_keys={path}", "deploy.spawn_supernodes=2"))
    )
    with pytest.raises(config_lib.ConfigError, match="needs 'deploy.auth=true'"):
        validate_deploy(no_auth)
    with pytest.raises(config_lib.ConfigError, match="cannot read"):
        ownership.parse_keys_file(tmp_path / "missing.txt", 4)


@pytest.mark.parametrize("key", ["tls", "auth", "fast", "bind_partitions"])
def test_deploy_switches_are_true_or_false(tmp_path, deploy_data, key):
    cfg = config_lib.validate(compose(overrides(deploy_data, tmp_path / "run", f"deploy.{key}=maybe")))
    with pytest.raises(config_lib.ConfigError, match=rf"'deploy\.{key}' must be true or false, got 'maybe'"):
        validate_deploy(cfg)
