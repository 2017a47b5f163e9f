"""Pins of the Flower 1.39 internals that server/deploy/flwr_fast.py and server/deploy/control.py rely on: each test
fails loudly (naming the internal) when another flwr version changes one of them. Fast: no federation is started."""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import socket

import flwr
import pytest
from deploy_helpers import ROOT

from server.deploy import control, flwr_fast
from server.run.progress import format_duration


def _params(fn) -> set[str]:
    return set(inspect.signature(fn).parameters)


def test_flwr_version_is_the_one_read():
    assert flwr.__version__ == flwr_fast.FLWR_VERSION, (
        f"server/deploy/flwr_fast.py was written against flwr {flwr_fast.FLWR_VERSION}; re-read the internals it lists "
        "in INTERNALS before using another version")


@pytest.mark.parametrize("module, attr", flwr_fast.INTERNALS + control.INTERNALS)
def test_internal_exists(module, attr):
    assert hasattr(importlib.import_module(module), attr), f"{module}.{attr} is gone"


def test_control_client_calls():
    """server/deploy/control.py: the Control API client's methods and constructor, the request fields it sets,
    the node status it filters on, and the key checks and encoding of the CLI's key loader."""
    from flwr.proto.control_pb2 import ListNodesResponse, ListRunsRequest, RegisterNodeRequest
    from flwr.supercore.control import ControlHttpClient

    for method in ("ListNodes", "RegisterNode", "ListRuns", "close"):
        assert callable(getattr(ControlHttpClient, method)), method
    assert {"server_address", "insecure", "root_certificates", "interceptors"} <= \
        _params(ControlHttpClient.from_server_address)
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
        client = control.ControlClient(f"127.0.0.1:{sock.getsockname()[1]}")
        try:
            with pytest.raises(control.ControlError, match="ListNodes failed"):
                client.online_node_ids()
            with pytest.raises(control.ControlError, match="ListRuns failed"):
                client.run_status(1)
            with pytest.raises(control.ControlError, match="not a usable SuperNode public key"):
                client.register_node(ROOT / "README.md")  # checked before any request
            with pytest.raises(control.ControlError, match="not a usable SuperNode public key"):
                client.register_node(ROOT / "no-such.pub")
        finally:
            client.close()


def test_supernode_loop_sleeps_and_hooks():
    """The pull loop sleeps through the module's `time` and calls `_pull_and_store_message` by global name."""
    module = importlib.import_module(flwr_fast.SUPERNODE_LOOP)
    source = inspect.getsource(module)
    assert "import time\n" in source and "time.sleep(3)" in source and "time.sleep(0.5)" in source
    loop = inspect.getsource(module.start_client_internal)
    assert "run_id = _pull_and_store_message(" in loop and "if run_id is None:" in loop
    assert "Return None if no message is received" in inspect.getdoc(module._pull_and_store_message)
    assert "pull_objects(" in inspect.getsource(module._pull_and_store_message)


def test_object_pull_backoff_parameters():
    for module, attr in flwr_fast.OBJECT_PULLS:
        fn = getattr(importlib.import_module(module), attr)
        fn = fn.func if isinstance(fn, functools.partial) else fn
        assert set(flwr_fast.PULL_BACKOFF) <= _params(fn), f"{module}.{attr}"
    run_clientapp = importlib.import_module(flwr_fast.CLIENTAPP_RUNTIME)
    assert "pull_and_inflate_object_from_tree(" in inspect.getsource(run_clientapp.pull_task_input)
    grid = importlib.import_module(flwr_fast.SERVERAPP_GRID)
    assert "pull_objects(" in inspect.getsource(grid.HttpGrid.pull_messages)


def test_superlink_object_store_construction(monkeypatch):
    """The SuperLink builds its object store as ObjectStoreFactory(database) (module global of config_loader)."""
    module = importlib.import_module(flwr_fast.SUPERLINK_CONFIG)
    assert "objectstore_factory = ObjectStoreFactory(database)" in inspect.getsource(
        module.get_objectstore_linkstate_factories)
    monkeypatch.setattr(module, "ObjectStoreFactory", module.ObjectStoreFactory)
    flwr_fast.patch_object_store_in_memory()
    flwr_fast.patch_object_store_in_memory()
    from flwr.supercore.object_store.in_memory_object_store import InMemoryObjectStore

    assert isinstance(module.ObjectStoreFactory("/tmp/unused-state.db").store(), InMemoryObjectStore)


def test_worker_calls():
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import SuperExecAuthHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.superexec.run_superexec import _SUPEREXEC_AUTH_METHODS
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    assert {"runtime_api_address", "token", "insecure", "certificates", "parent_pid",
            "runtime_dependency_install"} <= _params(run_clientapp)
    assert {"server_address", "insecure", "root_certificates", "interceptors", "retry_invoker"} <= _params(
        RuntimeHttpClient.from_server_address)
    assert {"master_secret", "protected_methods"} <= _params(SuperExecAuthHttpInterceptor)
    assert "/flwr.proto.Runtime/AcquireTask" in _SUPEREXEC_AUTH_METHODS
    assert TaskType.CLIENT_APP == "flwr-clientapp"
    assert "supported_task_types" in AcquireTaskRequest.DESCRIPTOR.fields_by_name
    assert "flwr_exit(" in inspect.getsource(run_clientapp)  # ends with sys.exit: the fork turns it into _exit


def test_supernode_cli_flags():
    """The flags the launcher and flower-deploy pass to flower-supernode still exist."""
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    args = _parse_args_run_supernode().parse_args(
        ["--insecure", "--superlink", "127.0.0.1:1", "--isolation", "process", "--superexec-auth-secret-file", "s",
         "--max-wait-time", "5", "--host", "127.0.0.1", "--port", "9999", "--node-config", "partition-id=0"])
    assert (args.isolation, args.max_wait_time, args.superexec_auth_secret_file) == ("process", 5.0, "s")


class FakeClock:
    """``time`` for flwr_fast: sleeping only advances ``monotonic()`` and records the duration."""

    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def test_patches_apply_and_are_idempotent(monkeypatch):
    module = importlib.import_module(flwr_fast.SUPERNODE_LOOP)
    for mod_name, attr in [(flwr_fast.SUPERNODE_LOOP, "time"), (flwr_fast.SUPERNODE_LOOP, "_pull_and_store_message"),
                           *flwr_fast.OBJECT_PULLS]:
        mod = importlib.import_module(mod_name)
        monkeypatch.setattr(mod, attr, getattr(mod, attr))  # restored after the test
    flwr_fast.patch_supernode_loop(0.01)
    flwr_fast.patch_supernode_loop(0.01)
    clock = FakeClock()
    monkeypatch.setattr(flwr_fast, "time", clock)  # the sleeps asked for, not how long a loaded machine took
    module.time.sleep(3)  # the idle wait: capped at the poll interval
    module.time.sleep(0.5)  # a wait on local state: capped at LOCAL_WAIT
    assert clock.slept == [0.01, flwr_fast.LOCAL_WAIT] and module.time.monotonic() > 0
    flwr_fast.patch_object_pulls()
    flwr_fast.patch_object_pulls()
    for mod_name, attr in flwr_fast.OBJECT_PULLS:
        fn = getattr(importlib.import_module(mod_name), attr)
        assert isinstance(fn, functools.partial) and not isinstance(fn.func, functools.partial)
        assert fn.keywords == flwr_fast.PULL_BACKOFF
    watch = flwr_fast.LoopWatch(None)
    assert module._pull_and_store_message == watch.pull and not watch.joined


def test_join_failure_hint_names_the_likely_cause():
    hint = flwr_fast.join_failure_hint(["--insecure", "--superlink", "h:1"])
    assert "h:1" in hint and "--root-certificates" in hint
    hint = flwr_fast.join_failure_hint(["--root-certificates", "ca.crt", "--auth-supernode-private-key", "k",
                                        "--superlink", "h:1"])
    assert "ca.crt" in hint and "flwr supernode register" in hint


def test_format_duration():
    assert [format_duration(s) for s in (12.4, 2460, 8280)] == ["12 s", "41 min", "2.3 h"]


def test_fleet_run_status_cache(monkeypatch):
    """Fleet object calls look a running run up at most every RUN_STATUS_TTL; an abort is never cached."""
    module = importlib.import_module(flwr_fast.FLEET_HANDLERS)
    for handler in (module.push_object, module.pull_object):
        assert "abort_msg = check_abort(" in inspect.getsource(handler)
    assert list(inspect.signature(module.check_abort).parameters) == ["run_id", "abort_status_list", "state"]
    monkeypatch.setattr(module, "check_abort", module.check_abort)
    flwr_fast.patch_fleet_run_checks()
    flwr_fast.patch_fleet_run_checks()
    assert isinstance(module.check_abort, flwr_fast.RunStatusCache)
    assert not isinstance(module.check_abort.check_abort, flwr_fast.RunStatusCache)

    clock = FakeClock()
    monkeypatch.setattr(flwr_fast, "time", clock)  # the ttl in clock time: no chance on a loaded machine
    answers, calls = {1: None, 2: "Run is finished."}, []
    cache = flwr_fast.RunStatusCache(lambda run_id, statuses, state: calls.append(run_id) or answers[run_id], 0.2)
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

    module = importlib.import_module(flwr_fast.CLIENTAPP_RUNTIME)
    assert "install_from_fab(fab.content, skip_prompt=True)" in inspect.getsource(module.run_clientapp)
    monkeypatch.setattr(module, "install_from_fab", module.install_from_fab)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr_home"))
    calls = []

    def counting(*args, **kwargs):
        calls.append(1)
        return module.install_from_fab(*args, **kwargs)

    install = flwr_fast.InstallOnce(counting, tmp_path / "markers")
    (tmp_path / "markers").mkdir()
    fab = build_fab_from_disk(ROOT)
    first = install(fab, skip_prompt=True)
    assert install(fab, skip_prompt=True) == first and (first / "client" / "app.py").is_file() and calls == [1]
    installed = []  # other bytes (another hash) go to Flower again, and so does a vanished install
    fake = flwr_fast.InstallOnce(lambda fab_file, install_dir, skip: installed.append(fab_file) or first,
                                 tmp_path / "markers")
    assert fake(fab + b"x") == first and fake(fab + b"x") == first and installed == [fab + b"x"]
    (tmp_path / "markers" / hashlib.sha256(fab + b"x").hexdigest()).write_text(str(tmp_path / "gone"))
    assert fake(fab + b"x") == first and len(installed) == 2
    flwr_fast.patch_fab_install(tmp_path / "markers")
    flwr_fast.patch_fab_install(tmp_path / "markers")
    assert isinstance(module.install_from_fab, flwr_fast.InstallOnce)
    assert not isinstance(module.install_from_fab.install, flwr_fast.InstallOnce)
