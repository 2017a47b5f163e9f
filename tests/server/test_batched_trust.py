"""The batched engine keeps every guarantee of the others: broken replies are rejected and counted, a killed and
resumed run ends with the bitwise-same model, progress and chunks, and bad engine settings are one-line errors."""

import json

import broken_app
import numpy as np
import pytest
from flwr.app import Message
from simcli import full_and_resumed, run_cli, sim_args
from test_batched_engine import make_cfg

from server.batched.grid import NODE_BASE, BatchedGrid
from server.report.metrics import read_metrics
from server.run.app import run_experiment
from server.run.evaluator import Evaluator

NUM_HONEST = 4
NUM_NODES = NUM_HONEST + len(broken_app.BROKEN_KINDS)


def breaker(reply: Message, msg: Message) -> Message:
    """Break the train replies of partitions NUM_HONEST.. in the way ``broken_app.BROKEN_KINDS`` says."""
    partition = msg.metadata.dst_node_id - NODE_BASE
    if msg.metadata.message_type != "train" or partition < NUM_HONEST:
        return reply
    kind = broken_app.BROKEN_KINDS[partition - NUM_HONEST]
    if kind == "raises":
        raise RuntimeError("this client crashed")
    return Message(broken_app.corrupt(reply, kind), reply_to=msg)


def dropper(reply: Message, msg: Message) -> Message:
    """The reference: the same nodes, the broken ones failing instead (nothing of theirs is aggregated)."""
    if msg.metadata.message_type == "train" and msg.metadata.dst_node_id - NODE_BASE >= NUM_HONEST:
        raise RuntimeError("dropped")
    return reply


@pytest.mark.parametrize("strategy", [[], ["strategy=fedcm"], ["strategy=localupdate_decay"]])
def test_broken_replies_are_rejected_and_counted(tiny_data, tmp_path, strategy):
    models = {}
    for name, tamper in (("broken", breaker), ("dropped", dropper)):
        cfg = make_cfg(
            tiny_data,
            tmp_path / name,
            "model=logreg",
            "engine=batched",
            f"num_clients={NUM_NODES}",
            "participation.fraction=1.0",
            "num_rounds=2",
            *strategy,
        )
        grid = BatchedGrid(NUM_NODES, reply_filter=tamper, chunk_size=5)
        run_experiment(grid, cfg, cfg["run_dir"])
        assert grid.stacked_rounds == 2
        with np.load(tmp_path / name / "final_model.npz") as f:
            models[name] = {k: f[k] for k in f.files}
        rows = read_metrics(tmp_path / name)[1:]
        assert [r["num_replies"] for r in rows] == [NUM_HONEST] * 2
        rejected = len(broken_app.BROKEN_KINDS) - 1 if name == "broken" else 0  # "raises" is a failure
        assert [r["num_rejected"] for r in rows] == [rejected] * 2
        assert [r["num_failures"] for r in rows] == [NUM_NODES - NUM_HONEST - rejected] * 2
    for k in models["dropped"]:
        np.testing.assert_array_equal(models["broken"][k], models["dropped"][k])
    log = (tmp_path / "broken" / "run.log").read_text()
    assert "wrong shape" in log or "shape" in log


@pytest.mark.e2e
def test_killed_and_resumed_batched_run_is_bitwise_the_same(tiny_data, tmp_path):
    """FedHBM on logistic regression: stacked clients, client state on disk, strategy state in the checkpoint."""
    full_and_resumed(tiny_data, tmp_path, ["engine=batched", "model=logreg", "strategy=fedhbm", "num_rounds=40"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("engine.name=warp", "engine.name"),
        ("engine.chunk_size=0", "engine.chunk_size"),
        ("engine.vectorize=maybe", "engine.vectorize"),
        ("engine.workers=0", "engine.workers"),
        ("engine.device=tpu", "engine.device"),
        ("backend.address=auto", "engine=batched"),
    ],
)
def test_bad_engine_settings_exit_2_before_any_work(tiny_data, tmp_path, override, message):
    extra = [override] if override.startswith("engine.name") else ["engine=batched", override]
    proc = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "run", *extra), timeout=120)
    assert proc.returncode == 2, proc.stderr[-1500:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("flower-simulation: invalid configuration")]
    assert len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "run" / "metrics.csv").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("plots", [True, False])
def test_batched_cli_run_writes_the_usual_run_dir(tiny_data, tmp_path, plots):
    """Every file of a run dir; with ``plots=false`` every one but the PNGs."""
    run_dir = tmp_path / "run"
    proc = run_cli(
        "flower-simulation",
        sim_args(tiny_data, run_dir, "engine=batched", "progress_every=0.001", f"plots={str(plots).lower()}"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run_dir / "status.json").read_text())["status"] == "finished"
    for name in (
        "metrics.csv",
        "metrics.jsonl",
        "final_model.npz",
        "summary.json",
        "config.json",
        "partition.csv",
        "partition.json",
    ):
        assert (run_dir / name).exists(), name
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    assert pngs == (["accuracy.png", "loss.png", "lr.png", "norm.png", "partition.png"] if plots else []), pngs
    assert "Batched engine: 4 nodes on cpu, one client after another" in proc.stderr + proc.stdout
    # progress_every=0.001: a round's lines count from its start, and a client's training takes longer than 2 ms, so
    # both completions come past their report time (test_progress_lines_count_from_the_round_start)
    assert "[batched] 2/2 clients done" in (run_dir / "run.log").read_text()


def test_progress_lines_count_from_the_round_start(monkeypatch, caplog):
    """A round's in-round lines: the first once report_every seconds have passed since the round's training started
    (not since its first client finished), then one per report_every; late ones catch up at each completion."""
    from server.batched import grid as grid_module

    clock = [100.0]
    monkeypatch.setattr(grid_module.time, "monotonic", lambda: clock[0])
    grid = BatchedGrid(2, report_every=2.0)
    lines: list[str] = []
    monkeypatch.setattr(grid_module, "log", lambda level, msg, *args: lines.append(msg % args))
    grid.start_round_clock()
    for at, done in ((101.0, 1), (102.5, 2), (103.0, 3), (107.0, 4), (107.1, 5), (107.2, 6), (107.3, 7)):
        clock[0] = at
        grid._progress(done, 7)
    assert lines == [
        "[batched] 2/7 clients done, 2.5 s elapsed",  # due at 102
        "[batched] 4/7 clients done, 7.0 s elapsed",  # due at 104
        "[batched] 5/7 clients done, 7.1 s elapsed",  # due at 106: catching up
    ]


def test_messages_the_grid_cannot_serve_get_error_replies():
    """A message to a node that does not exist, or of a type no ClientApp handler serves, is answered with an error
    reply (as Flower does), never an exception in the round loop."""
    from flwr.app import ConfigRecord, RecordDict

    grid = BatchedGrid(2)
    content = RecordDict({"config": ConfigRecord({})})
    missing = Message(content, 5, "query")
    odd = Message(content, NODE_BASE, "query.unknown")
    replies = {r.metadata.reply_to_message_id: r for r in grid.send_and_receive([missing, odd])}
    assert replies[missing.metadata.message_id].error.code == 5  # NODE_UNAVAILABLE
    assert "no handler" in replies[odd.metadata.message_id].error.reason
    ok = Message(content, NODE_BASE + 1, "query")
    (reply,) = grid.send_and_receive([ok])
    assert reply.content["config"]["partition-id"] == 1 and not reply.has_error()


@pytest.mark.e2e
def test_engine_device_is_set_for_the_run_and_restored_after(tiny_data, tmp_path, monkeypatch):
    """engine.device=cpu reaches the ClientApp's own device choice (``$FEDMOMENTUM_DEVICE``) during the run, on a
    GPU machine too, and the variable is restored afterwards."""
    from client import train
    from client.environment import DEVICE_ENV
    from server.batched import engine

    seen = []
    real = engine.run_experiment

    def spy(grid, cfg, run_dir):
        seen.append((engine.os.environ.get(DEVICE_ENV), train.get_device()))
        return real(grid, cfg, run_dir)

    monkeypatch.setattr(engine, "run_experiment", spy)
    monkeypatch.setenv(DEVICE_ENV, "meta")  # whatever was there before the run comes back after it
    cfg = make_cfg(
        tiny_data,
        tmp_path / "run",
        "engine=batched",
        "engine.workers=1",
        "engine.device=cpu",
        "num_rounds=1",
        "model=logreg",
    )
    engine.simulate(cfg)
    assert seen == [("cpu", train.torch.device("cpu"))]
    assert engine.os.environ[DEVICE_ENV] == "meta"
    monkeypatch.delenv(DEVICE_ENV)
    train.get_device.cache_clear()


def test_a_train_request_whose_arrays_the_model_cannot_take_gets_an_error_reply_and_the_others_train(
    tiny_data, monkeypatch
):
    """The stacked path checks each request's arrays against the model (names, shapes) as the ClientApp does: a
    request the client refuses is answered by its handler with an error reply, and the round's other clients still
    train stacked (not one by one after a failed chunk)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, RecordDict

    from client import app as client_app
    from client import config as C
    from client.models import build_model
    from strategies import protocol as P

    state = build_model("logreg").state_dict()
    good = ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})
    bad = ArrayRecord({k: Array(np.zeros((3, *v.shape[1:]), np.float32)) for k, v in state.items()})
    config = ConfigRecord(
        {
            C.DATASET: "cifar10_folder",
            C.DATA_ROOT: str(tiny_data["tarball"]),
            C.CACHE_DIR: str(tiny_data["cache"]),
            C.MODEL: "logreg",
            C.NUM_PARTITIONS: 3,
            C.BATCH_SIZE: 8,
            P.ALGORITHM: "fedavgm",
            P.CLIENT_LR: 0.05,
            P.LOCAL_EPOCHS: 1,
            P.SERVER_ROUND: 1,
        }  # fmt: skip
    )
    handled = []
    handler = client_app.train
    monkeypatch.setattr(client_app, "train", lambda m, c: handled.append(m.metadata.dst_node_id) or handler(m, c))
    grid = BatchedGrid(3, vectorize=True)
    messages = [
        grid.create_message(RecordDict({P.ARRAYS: arrays, P.CONFIG: config}), MessageType.TRAIN, NODE_BASE + p, "1")
        for p, arrays in enumerate([good, bad, good])
    ]
    by_id = {r.metadata.reply_to_message_id: r for r in grid.send_and_receive(messages)}
    replies = [by_id[m.metadata.message_id] for m in messages]
    assert replies[1].has_error() and "has shape (3, 3072), model has (10, 3072)" in replies[1].error.reason
    assert not replies[0].has_error() and not replies[2].has_error() and grid.stacked_rounds == 1
    assert handled == [NODE_BASE + 1]  # only the refused request went to its handler
    assert replies[0].content[P.METRICS][P.NUM_STEPS] > 0


class CrashingEvaluator(Evaluator):
    """A real evaluator whose third evaluation (round 2's) raises, as a bug or an out-of-memory would."""

    calls = 0

    def metrics(self, arrays, population=None):
        type(self).calls += 1
        if type(self).calls == 3:
            raise RuntimeError("evaluation crashed\nits second line")
        return super().metrics(arrays, population)


def test_an_error_the_run_does_not_account_for_marks_it_failed_and_it_resumes(tiny_data, tmp_path):
    """status.json said ``running`` for ever after an unexpected error (a report took the run for one still going):
    now ``failed``, ``crashed: <type>: <first line>``, at the last round written; ``resume=true`` finishes it."""
    cfg = make_cfg(tiny_data, tmp_path / "run", "model=logreg", "engine=batched")
    CrashingEvaluator.calls = 0
    with pytest.raises(RuntimeError, match="evaluation crashed"):
        run_experiment(BatchedGrid(4), cfg, cfg["run_dir"], evaluator=CrashingEvaluator)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status == {"status": "failed", "round": 1, "reason": "crashed: RuntimeError: evaluation crashed"}
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1]
    resumed = make_cfg(tiny_data, tmp_path / "run", "model=logreg", "engine=batched", "resume=true")
    run_experiment(BatchedGrid(4), resumed, resumed["run_dir"])
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "finished"
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [0, 1, 2, 3]


def test_rounds_that_aggregated_no_reply_are_counted_and_said_at_the_end(tiny_data, tmp_path):
    """A run whose rounds 2 and 3 changed nothing (every reply failed) finished with the usual line, nothing hinting
    that its model stopped at round 1: now summary.json counts those rounds, run.log warns, the final line says so."""
    from server.run.console import summary_line

    passed = []

    def fail_after_round_1(reply: Message, msg: Message) -> Message:
        if msg.metadata.message_type == "train":
            if len(passed) >= 2:  # 2 clients a round: round 1's replies pass
                raise RuntimeError("this client crashed")
            passed.append(msg)
        return reply

    cfg = make_cfg(tiny_data, tmp_path / "run", "model=logreg", "engine=batched")
    summary = run_experiment(BatchedGrid(4, reply_filter=fail_after_round_1), cfg, cfg["run_dir"])
    assert [r["num_replies"] for r in read_metrics(tmp_path / "run")[1:]] == [2, 0, 0]
    assert summary["rounds_without_replies"] == 2
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds_without_replies"] == 2
    assert "2 of 3 rounds aggregated no reply (first: round 2)" in (tmp_path / "run" / "run.log").read_text()
    line = summary_line("flower-simulation", cfg, summary, 1.0)
    assert line.endswith("; 2 of 3 rounds aggregated no reply (run.log says why)")
    clean = make_cfg(tiny_data, tmp_path / "clean", "model=logreg", "engine=batched")
    summary = run_experiment(BatchedGrid(4), clean, clean["run_dir"])
    assert summary["rounds_without_replies"] == 0 and "aggregated no reply" not in summary_line("x", clean, summary, 1)
