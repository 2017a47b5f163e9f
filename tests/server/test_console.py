"""What a run prints (server/run/console.py): one console line per round without zero counters, a final summary
naming the algorithm, node <-> partition lines and per-round details in run.log only, cli.log without other
libraries' DEBUG lines unless verbose=true."""

import io
import logging
import re
import threading

import pytest
from flwr.common.logger import ConsoleHandler
from hydra import compose, initialize_config_dir
from simcli import IN_PROCESS, run_cli, sim_args

from server.run import config as config_lib
from server.run import console
from server.run.config import CONF_DIR

ROW = {
    "accuracy": 0.25,
    "loss": 2.1,
    "num_selected": 5,
    "num_replies": 5,
    "num_rejected": 0,
    "num_failures": 0,
    "num_skipped": 0,
    "num_refused": 0,
    "num_reassigned": 0,
    "num_silent": 0,
    "seconds": 12.34,
}


def test_round_line_shows_only_non_zero_counters_and_missing_replies():
    assert console.round_line(3, 10, ROW, 125.0) == "[round 3/10] accuracy 0.2500 loss 2.1000, 12.3 s, run ETA 2 min"
    bad = {**ROW, "num_replies": 3, "num_rejected": 1, "num_silent": 1, "accuracy": None, "loss": None}
    assert (
        console.round_line(10, 10, bad, None)
        == "[round 10/10] not evaluated, replies 3/5, rejected 1, silent 1, 12.3 s"
    )
    assert console.round_line(1, 2, ROW, None).endswith(", run ETA ?")


def _strategy(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["run_dir=/tmp/unused", *overrides])
    return config_lib.to_plain(cfg)["strategy"]


@pytest.mark.parametrize(
    "overrides, label",
    [
        ((), "FedAvg (FedAvgM, momentum 0)"),  # the default strategy=fedavg: FedAvgM with beta = 0
        (("strategy=fedavgm",), "FedAvgM"),
        (("strategy.server_optimizer=yogi",), "FedAvgM with a server Yogi step"),
        (("strategy=fedcm",), "FedCM"),
        (("strategy=localupdate_decay",), "LocalUpdateDecay"),
        (("strategy=fedhbm",), "FedHBM"),
    ],
)
def test_strategy_label_names_the_algorithm_that_runs(overrides, label):
    assert console.strategy_label(_strategy(*overrides)) == label


@pytest.mark.parametrize("n, text", [(1, "1 client"), (4, "4 clients")])
def test_run_label_counts_clients_in_words(n, text):
    cfg = {"strategy": _strategy(), "model": {"name": "logreg"}, "num_clients": n}
    assert console.run_label(cfg) == f"FedAvg (FedAvgM, momentum 0), logreg, {text}"


@pytest.fixture
def routed():
    """Flower's logger with a console handler and a run.log-like handler, as a run has them; yields a function
    logging the kinds of lines a run logs and returning (console text, file text)."""
    flwr = logging.getLogger("flwr")
    screen, file = io.StringIO(), io.StringIO()
    handlers = [ConsoleHandler(colored=False, stream=screen), logging.StreamHandler(file)]
    handlers[1].addFilter(console.RunLogFilter())
    saved = flwr.handlers[:]
    flwr.handlers[:] = handlers

    def emit(verbose):
        screen.truncate(0), file.truncate(0)
        with console.console_routing(verbose):
            flwr.info("Round %d: node %s serves partition %d", 1, 123, 4)
            flwr.info("configure_train: round %d, %d nodes", 1, 2)
            flwr.info("%s: Received %s results and %s failures", "aggregate_train", 2, 0)
            flwr.info("full line rejected 0", extra=console.TO_FILE)
            flwr.info("short line", extra=console.TO_CONSOLE)
            flwr.warning("a warning")
            for _ in range(5):
                flwr.info("Waiting for nodes: %d of %d partitions answered", 0, 4)
        flwr.info("after the run")
        return screen.getvalue(), file.getvalue()

    yield emit
    flwr.handlers[:] = saved


def test_the_console_leaves_details_to_run_log(routed):
    screen, file = routed(False)
    waiting = ["Waiting for nodes: 0 of 4 partitions answered"] * 3  # the 1st, 2nd and 4th of five
    assert [line.split(":", 1)[1].strip() for line in screen.splitlines()] == [
        "short line",
        "a warning",
        *waiting,
        "after the run",
    ]
    assert file.count("Waiting for nodes") == 5
    assert "serves partition 4" in file and "configure_train" in file and "aggregate_train" in file
    assert "full line rejected 0" in file and "short line" not in file


def test_verbose_shows_run_log_lines_on_the_console(routed):
    screen, file = routed(True)
    assert "serves partition 4" in screen and "full line rejected 0" in screen and "short line" not in screen
    assert screen.count("\n") == file.count("\n") == 11  # run.log's ten lines + the one after the run


def test_runs_side_by_side_share_one_console_filter_and_log_to_their_own_run_log(tmp_path):
    """Routing nested twice installs one filter, removed when the last run ends; a record of a thread reaches that
    thread's run.log only."""
    from server.internals.flower_logger import console_handlers

    def filters():
        return sum(isinstance(f, console.ConsoleFilter) for h in console_handlers() for f in h.filters)

    before = filters()
    with console.console_routing(False):
        with console.console_routing(False):
            assert filters() == before + 1
        assert filters() == before + 1
    assert filters() == before
    flwr, logs = logging.getLogger("flwr"), {}

    def job(name):
        handler = logging.FileHandler(tmp_path / f"{name}.log")
        with console.thread_run_log(handler):
            flwr.info("line of %s", name)
        handler.close()
        logs[name] = (tmp_path / f"{name}.log").read_text()

    threads = [threading.Thread(target=job, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert logs == {"a": "line of a\n", "b": "line of b\n"}
    assert not any(isinstance(h, console.ThreadRunLogs) for h in flwr.handlers)


def test_cli_log_drops_debug_and_other_libraries_info_unless_verbose():
    def record(name, level, msg="x"):
        return logging.LogRecord(name, level, __file__, 1, msg, (), None)

    quiet, loud = console.CliLogFilter(False), console.CliLogFilter(True)
    debug, other, mine = record("flwr", logging.DEBUG), record("alembic.runtime", logging.INFO), record("flwr", 20)
    assert [quiet.filter(r) for r in (debug, other, mine)] == [False, False, True]
    assert [loud.filter(r) for r in (debug, other, mine)] == [True, True, True]
    assert quiet.filter(record("ray", logging.WARNING))
    assert not quiet.filter(record("flwr", logging.INFO, "Round %d: partitions %s on %d nodes"))


def _run(tiny_data, run_dir, *extra):
    proc = run_cli(
        "flower-simulation",
        sim_args(tiny_data, run_dir, *IN_PROCESS, "num_rounds=3", "progress_every=600", *extra),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stderr + proc.stdout)
    return proc.stderr + proc.stdout  # the log lines (stderr), then the summary (stdout)


@pytest.mark.e2e
def test_a_run_prints_one_line_per_round_and_a_summary(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    output = _run(tiny_data, run_dir)
    lines = [line for line in output.splitlines() if line.strip()]
    for r in (1, 2, 3):
        [line] = [line for line in lines if f"[round {r}/3]" in line]
        assert re.search(rf"\[round {r}/3\] accuracy [0-9.]+ loss [0-9.]+, [0-9.]+ s", line), line
    assert not re.search(r"\b(rejected|failures|skipped|refused|reassigned|silent) 0\b", output), output
    for detail in ("serves partition", "configure_train", "aggregate_train", "Round 1: partitions", "DEBUG"):
        assert detail not in output, detail
    assert f"Run dir {run_dir}: FedAvg (FedAvgM, momentum 0), cnn, 4 clients, rounds 1..3" in lines[1], lines
    summary = lines[-1]
    assert summary.startswith("flower-simulation: finished: FedAvg (FedAvgM, momentum 0), cnn, 4 clients, 3 rounds")
    assert re.search(rf"accuracy [0-9.]+, loss [0-9.]+, \d+ s; results in {re.escape(str(run_dir))}$", summary)
    assert len(lines) == 7, lines  # the engine, the run dir, rounds 0..3, the summary
    log = (run_dir / "run.log").read_text()
    assert log.count("serves partition") == 4 and "configure_train: round 3" in log
    assert re.search(r"\[round 3/3\] accuracy .* rejected 0 failures 0 skipped 0 refused 0 reassigned 0 silent 0", log)
    cli_log = (run_dir / "cli.log").read_text()
    assert "[round 3/3]" in cli_log and "serves partition" not in cli_log and "][DEBUG]" not in cli_log


@pytest.mark.e2e
def test_verbose_shows_every_run_log_line(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    output = _run(tiny_data, run_dir, "verbose=true")
    assert output.count("serves partition") == 4 and "configure_train: round 3" in output
    assert "rejected 0 failures 0" in output and "flower-simulation: finished: " in output
    assert "serves partition" in (run_dir / "cli.log").read_text()


def test_verbose_must_be_a_boolean(tiny_data, tmp_path):
    proc = run_cli("flower-simulation", sim_args(tiny_data, tmp_path / "bad", "verbose=loud"), timeout=120)
    assert proc.returncode == 2 and "'verbose' must be true or false" in proc.stderr


@pytest.mark.e2e
def test_ray_run_thins_in_round_progress_on_the_console_and_keeps_cli_log_quiet(tiny_data, tmp_path):
    """Flower's simulation: run.log has every in-round line (every progress_every s) and Flower's DEBUG lines;
    the console the 1st, 2nd, 4th, … in-round line of each round; cli.log no DEBUG line. Every round logs at least
    one line: a reply cannot exist at the pull right after the push, and the check that follows the first 0.1 s poll
    finds the 0.02 s report due."""
    run_dir = tmp_path / "run"
    proc = run_cli("flower-simulation", sim_args(tiny_data, run_dir, "progress_every=0.02"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run_dir / "run.log").read_text()
    for r in (1, 2):
        in_log = len(re.findall(rf"\[round {r}/2\] \d+/2 clients done", log))
        on_console = len(re.findall(rf"\[round {r}/2\] \d+/2 clients done", proc.stderr))
        assert in_log >= 1 and on_console == in_log.bit_length(), (r, in_log, on_console)
    assert " DEBUG " in log and "Round 1: node" in log  # run.log keeps everything
    cli_log = (run_dir / "cli.log").read_text()
    assert "[round 2/2]" in cli_log and "][DEBUG]" not in cli_log and "Round 1: node" not in cli_log
