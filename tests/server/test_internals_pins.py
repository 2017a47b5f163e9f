"""Pins of the library internals that server/internals uses (server/internals/pins.py): each test fails loudly,
naming the internal, when another flwr/Ray version changes one of them; and no module outside server/internals
imports a library's internals. Fast: no federation is started."""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.metadata
import inspect
import socket
from pathlib import Path

import pytest

from server.deploy import flwr_fast
from server.internals import (
    flower_clientapp,
    flower_control,
    flower_object_pulls,
    flower_superlink,
    flower_supernode,
    pins,
    scan,
)
from server.run.progress import format_duration

ROOT = Path(__file__).resolve().parents[2]
INTERNALS = ROOT / "server" / "internals"


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


@pytest.mark.parametrize("dist", sorted(pins.VERSIONS))
def test_installed_versions_are_the_ones_read(dist):
    installed = importlib.metadata.version(dist)
    assert installed == pins.VERSIONS[dist], (
        f"{dist} {installed} is installed but server/internals was written against {pins.VERSIONS[dist]}: re-read "
        f"every internal of pins.PINS from {dist}, then update pins.VERSIONS and pins.FINGERPRINTS"
    )


@pytest.mark.parametrize("pin", pins.PINS, ids=lambda p: f"{p.module}.{p.attr}")
def test_pinned_internal_exists(pin):
    try:
        pins.resolve(pin.module, pin.attr)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"{pin.module}.{pin.attr} ({pin.why}; server/internals/{pin.used_by}) is gone: {exc}")
    assert (INTERNALS / pin.used_by).is_file(), pin.used_by
    text = pins.source(pin.module, pin.attr) if pin.source_contains else ""
    for needle in pin.source_contains:
        assert needle in text, f"{pin.module}.{pin.attr} no longer contains {needle!r} ({pin.why})"


@pytest.mark.parametrize("key", sorted(pins.FINGERPRINTS), ids=lambda k: f"{k[0]}.{k[1]}")
def test_rewritten_or_replaced_code_is_unchanged(key):
    assert pins.fingerprint(*key) == pins.FINGERPRINTS[key], (
        f"{key[0]}.{key[1]} changed in this version: re-read it and what server/internals does in its place, "
        "then update pins.FINGERPRINTS"
    )


def test_fingerprint_reads_the_installed_file_not_a_patch(monkeypatch):
    """A patch applied in this process (as the engines do) does not change the fingerprint; a changed source does."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    key = ("flwr.server.superlink.linkstate.in_memory_linkstate", "InMemoryLinkState.get_message_ins")
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", lambda self, node_id, limit: [])
    assert pins.fingerprint(*key) == pins.FINGERPRINTS[key]
    source = pins.source(*key)
    assert source.lstrip().startswith("def get_message_ins(")
    assert hashlib.sha256((source + " ").encode()).hexdigest() != pins.FINGERPRINTS[key]


def test_public_aliases_are_the_public_objects():
    for (module, name), public in pins.PUBLIC_ALIASES.items():
        assert getattr(importlib.import_module(module), name) is getattr(importlib.import_module(public), name)


def test_every_internal_import_of_server_internals_is_pinned():
    """The list is complete: each private library import of a server/internals file is a pin of that file."""
    pinned = {(p.used_by, p.module, p.attr.split(".")[0]) for p in pins.PINS}
    modules = {(p.used_by, p.module) for p in pins.PINS}
    missing = []
    for path in sorted(INTERNALS.glob("*.py")):
        for line, module, names in scan.imports(ast.parse(path.read_text(encoding="utf-8"))):
            if not scan.is_private(module, names):
                continue
            if not names and (path.name, module) not in modules:
                missing.append(f"{path.name}:{line}: {module}")
            missing += [
                f"{path.name}:{line}: {module}.{n}"
                for n in names
                if (path.name, module, n) not in pinned and (module, n) not in pins.PUBLIC_ALIASES
            ]
    assert not missing, "server/internals imports internals that pins.PINS does not list: " + ", ".join(missing)


def test_no_module_outside_server_internals_imports_library_internals():
    files = scan.project_files(ROOT)
    assert ROOT / "server" / "ray" / "engine.py" in files and ROOT / "strategies" / "base.py" in files
    assert not any(f.is_relative_to(INTERNALS) or f.is_relative_to(ROOT / "tests") for f in files)
    found = scan.project_private_imports(ROOT)
    assert not found, "library internals imported outside server/internals (move them there):\n" + "\n".join(found)


def test_the_scan_catches_a_private_import():
    synthetic = (
        "import ray\n"
        "from flwr.app import Message\n"
        "from flwr.common.logger import log\n"  # a public name through its own module: allowed
        "import ray._private.node as node\n"
        "from flwr.supercore.task_identity import TaskIdentity\n"
        "from flwr.common import _private_name\n"
        "from server.deploy import flwr_fast\n"
        "def f():\n"
        "    from flwr.server.superlink.linkstate import InMemoryLinkState\n"
        "    importlib.import_module('flwr.supernode.start_client_internal')\n"
        "    from flwr.common.logger import update_console_handler\n"
    )
    assert scan.private_imports(synthetic, "synthetic.py") == [
        "synthetic.py:4: ray._private.node",
        "synthetic.py:5: flwr.supercore.task_identity (TaskIdentity)",
        "synthetic.py:6: flwr.common (_private_name)",
        "synthetic.py:9: flwr.server.superlink.linkstate (InMemoryLinkState)",
        "synthetic.py:10: flwr.supernode.start_client_internal",
        "synthetic.py:11: flwr.common.logger (update_console_handler)",
    ]


def test_the_project_scan_reads_every_project_file(tmp_path):
    """A private import in a new project file (even in a package of its own) is found; tests/ and
    server/internals/ are not scanned."""
    for rel in ("newpkg/mod.py", "server/internals/ok.py", "tests/test_x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("from flwr.supercore.constant import TaskType\n")
    assert scan.project_private_imports(tmp_path) == ["newpkg/mod.py:1: flwr.supercore.constant (TaskType)"]


def test_control_client_calls():
    """server/internals/flower_control.py: the Control API client's methods and constructor, the request fields it sets,
    the node status it filters on, and the key checks and encoding of the CLI's key loader."""
    from flwr.proto.control_pb2 import ListNodesResponse, ListRunsRequest, RegisterNodeRequest
    from flwr.supercore.control import ControlHttpClient

    for method in ("ListNodes", "RegisterNode", "ListRuns", "close"):
        assert callable(getattr(ControlHttpClient, method)), method
    assert {"server_address", "insecure", "root_certificates", "interceptors"} <= _params(
        ControlHttpClient.from_server_address
    )
    assert "public_key" in RegisterNodeRequest.DESCRIPTOR.fields_by_name
    assert "run_id" in ListRunsRequest.DESCRIPTOR.fields_by_name
    info = ListNodesResponse.DESCRIPTOR.fields_by_name["nodes_info"].message_type.fields_by_name
    assert {"node_id", "status"} <= set(info)
    assert '== "online"' in inspect.getsource(importlib.import_module("flwr.cli.supernode.ls"))
    loader = inspect.getsource(importlib.import_module("flwr.cli.supernode.register").try_load_public_key)
    assert all(name in loader for name in ("load_ssh_public_key", "uses_nist_ec_curve", "public_key_to_bytes"))


def test_control_client_failure_is_a_control_error():
    """A SuperLink that does not answer (a bound port nobody listens on: refused) is a ControlError, which
    Federation.node_ids reads as "no node online" and node_key as a DeployError."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        client = flower_control.ControlClient(f"127.0.0.1:{sock.getsockname()[1]}")
        try:
            with pytest.raises(flower_control.ControlError, match="ListNodes failed"):
                client.online_node_ids()
            with pytest.raises(flower_control.ControlError, match="ListRuns failed"):
                client.run_status(1)
            with pytest.raises(flower_control.ControlError, match="not a usable SuperNode public key"):
                client.register_node(ROOT / "README.md")  # checked before any request
            with pytest.raises(flower_control.ControlError, match="not a usable SuperNode public key"):
                client.register_node(ROOT / "no-such.pub")
        finally:
            client.close()


def test_supernode_loop_sleeps_and_hooks():
    """The pull loop sleeps through the module's `time` and calls `_pull_and_store_message` by global name."""
    module = importlib.import_module(flower_object_pulls.SUPERNODE_LOOP)
    source = inspect.getsource(module)
    assert "import time\n" in source and "time.sleep(3)" in source and "time.sleep(0.5)" in source
    loop = inspect.getsource(module.start_client_internal)
    assert "run_id = _pull_and_store_message(" in loop and "if run_id is None:" in loop
    assert "Return None if no message is received" in inspect.getdoc(module._pull_and_store_message)
    assert "pull_objects(" in inspect.getsource(module._pull_and_store_message)


def test_object_pull_backoff_parameters():
    for module, attr in flower_object_pulls.OBJECT_PULLS:
        fn = getattr(importlib.import_module(module), attr)
        fn = fn.func if isinstance(fn, functools.partial) else fn
        assert set(flower_object_pulls.PULL_BACKOFF) <= _params(fn), f"{module}.{attr}"
    run_clientapp = importlib.import_module(flower_object_pulls.CLIENTAPP_RUNTIME)
    assert "pull_and_inflate_object_from_tree(" in inspect.getsource(run_clientapp.pull_task_input)
    grid = importlib.import_module(flower_object_pulls.SERVERAPP_GRID)
    assert "pull_objects(" in inspect.getsource(grid.HttpGrid.pull_messages)


def test_superlink_object_store_construction(monkeypatch):
    """The SuperLink builds its object store as ObjectStoreFactory(database) (module global of config_loader)."""
    module = importlib.import_module(flower_superlink.SUPERLINK_CONFIG)
    assert "objectstore_factory = ObjectStoreFactory(database)" in inspect.getsource(
        module.get_objectstore_linkstate_factories
    )
    monkeypatch.setattr(module, "ObjectStoreFactory", module.ObjectStoreFactory)
    flower_superlink.patch_object_store_in_memory()
    flower_superlink.patch_object_store_in_memory()
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore

    assert isinstance(module.ObjectStoreFactory("/tmp/unused-state.db").store(), InMemoryObjectStore)


def test_worker_calls():
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import SuperExecAuthHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.run_superexec import _SUPEREXEC_AUTH_METHODS
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    assert {
        "runtime_api_address",
        "token",
        "insecure",
        "certificates",
        "parent_pid",
        "runtime_dependency_install",
    } <= _params(run_clientapp)
    assert {"server_address", "insecure", "root_certificates", "interceptors", "retry_invoker"} <= _params(
        RuntimeHttpClient.from_server_address
    )
    assert {"master_secret", "protected_methods"} <= _params(SuperExecAuthHttpInterceptor)
    assert "/flwr.proto.Runtime/AcquireTask" in _SUPEREXEC_AUTH_METHODS
    assert TaskType.CLIENT_APP == "flwr-clientapp"
    assert "supported_task_types" in AcquireTaskRequest.DESCRIPTOR.fields_by_name
    assert "flwr_exit(" in inspect.getsource(run_clientapp)  # ends with sys.exit: the fork turns it into _exit


def test_supernode_cli_flags():
    """The flags the launcher and flower-deploy pass to flower-supernode still exist."""
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    args = _parse_args_run_supernode().parse_args(
        [
            "--insecure",
            "--superlink",
            "127.0.0.1:1",
            "--isolation",
            "process",
            "--superexec-auth-secret-file",
            "s",
            "--max-wait-time",
            "5",
            "--host",
            "127.0.0.1",
            "--port",
            "9999",
            "--node-config",
            "partition-id=0",
        ]
    )
    assert (args.isolation, args.max_wait_time, args.superexec_auth_secret_file) == ("process", 5.0, "s")


class FakeClock:
    """``time`` for the patches: sleeping only advances ``monotonic()`` and records the duration."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def test_patches_apply_and_are_idempotent(monkeypatch):
    module = importlib.import_module(flower_object_pulls.SUPERNODE_LOOP)
    for mod_name, attr in [
        (flower_object_pulls.SUPERNODE_LOOP, "time"),
        (flower_object_pulls.SUPERNODE_LOOP, "_pull_and_store_message"),
        *flower_object_pulls.OBJECT_PULLS,
    ]:
        mod = importlib.import_module(mod_name)
        monkeypatch.setattr(mod, attr, getattr(mod, attr))  # restored after the test
    flower_supernode.patch_supernode_loop(0.01)
    flower_supernode.patch_supernode_loop(0.01)
    clock = FakeClock()
    monkeypatch.setattr(flower_supernode, "time", clock)  # the sleeps asked for, not how long a loaded machine took
    module.time.sleep(3)  # the idle wait: capped at the poll interval
    module.time.sleep(0.5)  # a wait on local state: capped at LOCAL_WAIT
    assert clock.slept == [0.01, flower_supernode.LOCAL_WAIT] and module.time.monotonic() > 0
    flower_object_pulls.patch_object_pulls()
    flower_object_pulls.patch_object_pulls()
    for mod_name, attr in flower_object_pulls.OBJECT_PULLS:
        fn = getattr(importlib.import_module(mod_name), attr)
        assert isinstance(fn, functools.partial) and not isinstance(fn.func, functools.partial)
        assert fn.keywords == flower_object_pulls.PULL_BACKOFF
    watch = flower_supernode.LoopWatch(None)
    assert module._pull_and_store_message == watch.pull and not watch.joined


def test_join_failure_hint_names_the_likely_cause():
    hint = flwr_fast.join_failure_hint(["--insecure", "--superlink", "h:1"])
    assert "h:1" in hint and "--root-certificates" in hint
    hint = flwr_fast.join_failure_hint(
        ["--root-certificates", "ca.crt", "--auth-supernode-private-key", "k", "--superlink", "h:1"]
    )
    assert "ca.crt" in hint and "flwr supernode register" in hint


def test_format_duration():
    assert [format_duration(s) for s in (12.4, 2460, 8280)] == ["12 s", "41 min", "2.3 h"]


def test_fleet_run_status_cache(monkeypatch):
    """Fleet object calls look a running run up at most every RUN_STATUS_TTL; an abort is never cached."""
    module = importlib.import_module(flower_superlink.FLEET_HANDLERS)
    for handler in (module.push_object, module.pull_object):
        assert "abort_msg = check_abort(" in inspect.getsource(handler)
    assert list(inspect.signature(module.check_abort).parameters) == ["run_id", "abort_status_list", "state"]
    monkeypatch.setattr(module, "check_abort", module.check_abort)
    flower_superlink.patch_fleet_run_checks()
    flower_superlink.patch_fleet_run_checks()
    assert isinstance(module.check_abort, flower_superlink.RunStatusCache)
    assert not isinstance(module.check_abort.check_abort, flower_superlink.RunStatusCache)

    clock = FakeClock()
    monkeypatch.setattr(flower_superlink, "time", clock)  # the ttl in clock time: no chance on a loaded machine
    answers, calls = {1: None, 2: "Run is finished."}, []
    cache = flower_superlink.RunStatusCache(
        lambda run_id, statuses, state: calls.append(run_id) or answers[run_id], 0.2
    )
    state = object()
    assert [cache(1, ["x"], state) for _ in range(3)] == [None] * 3 and calls == [1]
    assert [cache(2, ["x"], state) for _ in range(2)] == ["Run is finished."] * 2 and calls == [1, 2, 2]
    clock.sleep(0.25)  # past the ttl
    answers[1] = "Run is finished."
    assert cache(1, ["x"], state) == "Run is finished." and cache(1, ["x"], state) == "Run is finished."
    assert calls == [1, 2, 2, 1, 1]


def test_fab_installed_once_per_worker(monkeypatch, tmp_path):
    """The ClientApp runtime installs the task's FAB by a module-global call; a worker installs a FAB once."""
    from flwr.cli.build import build_fab_from_disk

    module = importlib.import_module(flower_object_pulls.CLIENTAPP_RUNTIME)
    assert "install_from_fab(fab.content, skip_prompt=True)" in inspect.getsource(module.run_clientapp)
    monkeypatch.setattr(module, "install_from_fab", module.install_from_fab)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr_home"))
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return module.install_from_fab(*args, **kwargs)

    install = flower_clientapp.InstallOnce(counting, tmp_path / "markers")
    (tmp_path / "markers").mkdir()
    fab = build_fab_from_disk(ROOT)
    first = install(fab, skip_prompt=True)
    assert install(fab, skip_prompt=True) == first and (first / "client" / "app.py").is_file() and calls == [1]
    installed = []  # other bytes (another hash) go to Flower again, and so does a vanished install
    fake = flower_clientapp.InstallOnce(
        lambda fab_file, install_dir, skip: installed.append(fab_file) or first, tmp_path / "markers"
    )
    assert fake(fab + b"x") == first and fake(fab + b"x") == first and installed == [fab + b"x"]
    (tmp_path / "markers" / hashlib.sha256(fab + b"x").hexdigest()).write_text(str(tmp_path / "gone"))
    assert fake(fab + b"x") == first and len(installed) == 2
    flower_clientapp.patch_fab_install(tmp_path / "markers")
    flower_clientapp.patch_fab_install(tmp_path / "markers")
    assert isinstance(module.install_from_fab, flower_clientapp.InstallOnce)
    assert not isinstance(module.install_from_fab.install, flower_clientapp.InstallOnce)
