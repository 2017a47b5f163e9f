"""Every internal of another library that :mod:`server.internals` uses, with the versions it was read in.

One :class:`Pin` per module attribute (a dotted ``attr`` reaches into a class): where it is used and why, and
text its source must still contain where we rely on how it works inside. :data:`FINGERPRINTS` holds the SHA-256
of the source (the signature, for a compiled function) of each library function whose work is rewritten or
replaced here, so a version that changes one fails ``tests/server/test_internals_pins.py`` however small the
change. :data:`PUBLIC_MODULES` and :data:`PUBLIC_ALIASES` define what the rest of the project may import
(:mod:`server.internals.scan`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# distribution -> the version whose internals were read (installed versions must match)
VERSIONS = {
    "flwr": "1.39.0",
    "ray": "2.55.1",
    "grpcio": "1.85.4",  # carries the Fleet API the patched SuperNode loop pulls over; no grpc internal is used
    "flwr-datasets": "0.6.1",
}
LIBRARIES = ("flwr", "ray", "grpc", "flwr_datasets")  # top-level import names of those distributions


@dataclass(frozen=True)
class Pin:
    module: str
    attr: str  # dotted within the module: "Class.method"
    why: str
    used_by: str  # file of server/internals
    source_contains: tuple[str, ...] = ()  # text the attribute's source must contain


_LOOP = "flwr.supernode.start_client_internal"
_RUNTIME = "flwr.supernode.runtime.run_clientapp"
_FLEET = "flwr.server.superlink.fleet.message_handler.message_handler"
_LINKSTATE = "flwr.server.superlink.linkstate.in_memory_linkstate"
_PULLS = "flower_object_pulls.py"
_NODE = "flower_supernode.py"
_LINK = "flower_superlink.py"
_APP = "flower_clientapp.py"
_CONTROL = "flower_control.py"
_INDEX = "flower_link_state.py"
_SHORT = "replaced by a partial with a short backoff"
_BACKOFF = ("initial_backoff", "backoff_cap", "max_tries_per_object")

PINS = (
    # object pulls with a short backoff: module globals called with Flower's default backoff keywords
    Pin(_LOOP, "pull_objects", _SHORT, _PULLS, _BACKOFF),
    Pin(_RUNTIME, "pull_and_inflate_object_from_tree", _SHORT, _PULLS, _BACKOFF),
    Pin("flwr.superlink.grid.http_grid", "pull_objects", _SHORT, _PULLS, _BACKOFF),
    # the SuperNode's pull loop
    Pin(_LOOP, "time", "replaced by ShortSleepTime: the loop's sleep(3) and sleep(0.5)", _NODE),
    Pin(_LOOP, "start_client_internal", "calls the loop's hooks by global name", _NODE, ("_pull_and_store_message(",)),
    Pin(_LOOP, "_pull_and_store_message", "wrapped by LoopWatch: run id once a message is stored", _NODE),
    Pin("flwr.supernode.cli.flower_supernode", "flower_supernode", "flower-supernode run in-process", _NODE),
    Pin("flwr.common.logger", "update_console_handler", "timestamps in the SuperNode's and worker's logs", _NODE),
    Pin(
        "flwr.common.logger",
        "ConsoleHandler",
        "the console handler the run's console filter attaches to",
        "flower_logger.py",
    ),  # fmt: skip
    # the SuperLink
    Pin("flwr.superlink.config_loader", "ObjectStoreFactory", "replaced: in-memory object store", _LINK),
    Pin(
        "flwr.superlink.config_loader",
        "get_objectstore_linkstate_factories",
        "builds the object store through the module global",
        _LINK,
        ("ObjectStoreFactory(database)",),
    ),
    Pin("flwr.supercore.constant", "FLWR_IN_MEMORY_DB_NAME", "the in-memory database name", _LINK),
    Pin(_FLEET, "check_abort", "replaced by RunStatusCache", _LINK),
    Pin(_FLEET, "push_object", "checks the run through the module global", _LINK, ("abort_msg = check_abort(",)),
    Pin(_FLEET, "pull_object", "checks the run through the module global", _LINK, ("abort_msg = check_abort(",)),
    Pin("flwr.superlink.cli.flower_superlink", "flower_superlink", "flower-superlink run in-process", _LINK),
    # the warm ClientApp worker
    Pin(_RUNTIME, "run_clientapp", "what flwr-clientapp runs, once per forked task", _APP, ("flwr_exit(",)),
    Pin(_RUNTIME, "install_from_fab", "replaced by InstallOnce", _APP),
    Pin(_RUNTIME, "pull_task_input", "pulls objects through the module global", _APP, ("pull_and_inflate_object",)),
    Pin("flwr.supercore.runtime", "RuntimeHttpClient", "the SuperNode's Runtime API, as SuperExec", _APP),
    Pin("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor", "the version header of requests", _APP),
    Pin("flwr.supercore.interceptors", "SuperExecAuthHttpInterceptor", "SuperExec's request signature", _APP),
    Pin("flwr.supercore.superexec.run_superexec", "_SUPEREXEC_AUTH_METHODS", "methods SuperExec signs", _APP),
    Pin("flwr.supercore.retry", "make_simple_http_retry_invoker", "SuperExec's retries", _APP),
    Pin("flwr.supercore.app_utils", "start_parent_process_monitor", "the worker ends with its SuperNode", _APP),
    Pin("flwr.supercore.constant", "TaskType", "the ClientApp task type", _APP),
    Pin("flwr.proto.runtime_pb2", "AcquireTaskRequest", "the task request", _APP),
    # the Control API client
    Pin("flwr.supercore.control", "ControlHttpClient", ".ListNodes, .RegisterNode, .ListRuns, .close", _CONTROL),
    Pin("flwr.cli.cli_client_interceptor", "CliClientHttpInterceptor", "the CLI's client header", _CONTROL),
    Pin("flwr.supercore.interceptors", "RuntimeVersionHttpInterceptor", "the version header", _CONTROL),
    Pin("flwr.proto.control_pb2", "ListNodesRequest", "flwr supernode list", _CONTROL),
    Pin("flwr.proto.control_pb2", "RegisterNodeRequest", "flwr supernode register", _CONTROL),
    Pin("flwr.proto.control_pb2", "ListRunsRequest", "flwr ls --run-id", _CONTROL),
    Pin("flwr.supercore.primitives.asymmetric", "uses_nist_ec_curve", "the register command's key check", _CONTROL),
    Pin("flwr.supercore.primitives.asymmetric", "public_key_to_bytes", "the register command's encoding", _CONTROL),
    # the simulation's LinkState index
    Pin(_LINKSTATE, "InMemoryLinkState.get_message_ins", "rewritten: walks one node's messages", _INDEX),
    Pin(_LINKSTATE, "InMemoryLinkState.store_message_ins", "wrapped: indexes each stored message", _INDEX),
    Pin(_LINKSTATE, "InMemoryLinkState._check_stored_messages", "Flower's checks of one message", _INDEX),
    Pin(
        _LINKSTATE,
        "InMemoryLinkState.__init__",
        "the message store and its lock",
        _INDEX,
        ("self.message_ins_store", "self.lock"),
    ),
    Pin("flwr.supercore.date", "now", "the delivery time stamp", _INDEX),
    # Ray
    Pin("ray._private.node", "wait_for_persisted_port", "replaced: waits with the GIL released", "ray_port_wait.py"),
    Pin("ray._raylet", "get_port_filename", "the port file awaited", "ray_port_wait.py"),
    Pin("ray._raylet", "wait_for_persisted_port", "called once the file exists", "ray_port_wait.py"),
    Pin("ray._common.utils", "get_ray_address_file", "backend.address=auto", "ray_cluster.py"),
    Pin("flwr.simulation.ray_transport.ray_actor", "pool_size_from_resources", "actors per node", "ray_cluster.py"),
    # the batched engine's in-process grid
    Pin("flwr.common.constant", "SUPERLINK_NODE_ID", "the SuperLink's node id", "flower_grid.py"),
    Pin("flwr.common.constant", "ErrorCode", "error replies", "flower_grid.py"),
    Pin("flwr.supercore.task_identity", "TaskIdentity", "the process's task identity", "flower_grid.py"),
    Pin(
        "flwr.app.metadata",
        "Metadata.message_id",
        "set in the private _message_id",
        "flower_grid.py",
        ('self.__dict__["_message_id"]',),
    ),
    # others
    Pin("flwr.cli.build", "build_fab_from_files", "stages the app as flwr run ships it", "flower_fab.py"),
    Pin("flwr.serverapp.strategy.strategy_utils", "sample_nodes", "Flower's node sampling", "flower_strategy.py"),
    Pin(
        "flwr_datasets.federated_dataset",
        "FederatedDataset.__init__",
        "the loaded DatasetDict is the private _dataset",
        "flower_datasets.py",
        ("self._dataset: DatasetDict",),
    ),
)

# (module, attr) -> SHA-256 of the code whose work is rewritten or replaced here (see fingerprint())
FINGERPRINTS = {
    (_LINKSTATE, "InMemoryLinkState.get_message_ins"): (
        "ebd0eddf4d9d8d30185bd1d5fc33390fb87c16aa0ed517b686b2d125646cfc11"
    ),
    (_FLEET, "check_abort"): "8229d0220d757aeea5672a1fad44979c860883b210af7d392015a765dccb5509",
    (_RUNTIME, "install_from_fab"): "83ba1a7fd50425aa91494f90b2c720feee682c8c11e8d2889aa2ad533624e10a",
    ("ray._raylet", "wait_for_persisted_port"): "02627f9859af560de45403ae13a463a5e99b76bbb4bdd31024b4e2680f16c475",
}

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

# library modules the project may import anywhere (the libraries' documented API)
PUBLIC_MODULES = frozenset(
    {
        "flwr",
        "flwr.app",
        "flwr.client",
        "flwr.clientapp",
        "flwr.common",
        "flwr.server",
        "flwr.serverapp",
        "flwr.serverapp.strategy",
        "flwr.simulation",
        "flwr_datasets",
        "flwr_datasets.partitioner",
        "grpc",
        "ray",
        "ray.util.scheduling_strategies",
    }
)
# (module, name) spellings of public names through another module: name -> the public module exporting it
PUBLIC_ALIASES = {("flwr.common.logger", "log"): "flwr.common"}


def resolve(module: str, attr: str) -> Any:
    """The object ``attr`` (dotted) of ``module``, imported."""
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def source(module: str, attr: str) -> str:
    """The source of ``attr`` (a function, method or class; dotted) as the installed file of ``module`` has it,
    whatever patches run in this process; for a compiled module, the name and signature of the live object."""
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec else None
    if not origin or not origin.endswith(".py"):
        obj = resolve(module, attr)
        return f"{getattr(obj, '__qualname__', attr)}{inspect.signature(obj)}"
    text = Path(origin).read_text(encoding="utf-8")
    body: list[ast.stmt] = ast.parse(text).body
    node: ast.AST | None = None
    first, *rest = attr.split(".")
    for imported in (n for n in body if isinstance(n, ast.ImportFrom) and n.module and not n.level):
        if any((alias.asname or alias.name) == first for alias in imported.names):  # defined elsewhere
            name = next(a.name for a in imported.names if (a.asname or a.name) == first)
            return source(imported.module, ".".join([name, *rest]))
    for part in attr.split("."):
        node = next((n for n in body if isinstance(n, _DEFS) and n.name == part), None)
        if node is None:
            raise LookupError(f"no definition of {attr} in {origin}")
        body = node.body  # type: ignore[attr-defined]
    return ast.get_source_segment(text, node) or ""


def fingerprint(module: str, attr: str) -> str:
    """SHA-256 of :func:`source`."""
    return hashlib.sha256(source(module, attr).encode()).hexdigest()
