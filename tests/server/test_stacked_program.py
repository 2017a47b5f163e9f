"""The stacked launcher's program (server/stacked): every job of a group equals the same job run alone on
``engine=batched`` — final model bitwise, every metrics column but the timings — for every registered strategy and
a FedOpt server optimizer, under cyclic and uniform participation; a diverging job leaves the group; checkpoints
pass between the stacked program and the batched engine both ways. The jobs share chunks (``share_chunks=True``,
the accelerator default): the harder case, where a job's clients train beside other jobs' clients; and where the
groups have several chunks, two threads compute them side by side (``engine.workers=2``, the CPU default on 2 cores)."""

import contextlib
import copy
import io
import json
import logging
import threading

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from checks.engine_cases import STRATEGIES
from server.ray.engine import CONF_DIR
from server.run import config as config_lib
from server.run.cli import simulate
from server.run.evaluator import Evaluator
from server.stacked.launch import plan, run_jobs, shape_key

pytestmark = pytest.mark.e2e
TIMINGS = ("seconds", "elapsed")
CASES = {**STRATEGIES, "fedavgm_adam": ["strategy=fedavgm", "strategy.momentum=0.0", "strategy.server_optimizer=adam"]}


def composed(run_dir, data, *overrides):
    base = [
        f"run_dir={run_dir}",
        "engine=batched",
        "data=cifar10_folder",
        f"data.root={data['folder']}",
        f"data.cache_dir={data['cache']}",
        "num_clients=6",
        "participation.fraction=0.5",
        "plots=false",
        "client.batch_size=8",
        "strategy.server_lr=0.5",
    ]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[*base, *overrides])
    return config_lib.validate(config_lib.to_plain(cfg))


@contextlib.contextmanager
def flwr_lines():
    """The messages logged to Flower's logger meanwhile."""
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logging.getLogger("flwr").addHandler(handler)
    try:
        yield lines
    finally:
        logging.getLogger("flwr").removeHandler(handler)


def rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


def assert_same_run(stacked_dir, lone_dir):
    a, b = np.load(stacked_dir / "final_model.npz"), np.load(lone_dir / "final_model.npz")
    assert a.files == b.files
    for k in a.files:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    assert rows(stacked_dir) == rows(lone_dir)
    assert json.loads((stacked_dir / "status.json").read_text()) == json.loads((lone_dir / "status.json").read_text())


@pytest.mark.parametrize(
    "model, rounds, extra",
    [("logreg", 20, []), ("cnn", 3, ["engine.vectorize=true", "client.local_steps=1", "eval_max_examples=10"])],
)
@pytest.mark.parametrize("mode", ["cyclic", "uniform"])
def test_each_stacked_job_equals_its_lone_batched_run(tmp_path, tiny_data, model, rounds, extra, mode):
    common = [f"model={model}", f"num_rounds={rounds}", f"participation.mode={mode}", "eval_every=2", *extra]
    common.append("engine.workers=2")  # chunks of a round on 2 threads (the lone runs stack: no worker processes)
    names = list(CASES)
    cfgs = [
        composed(tmp_path / "stacked" / name, tiny_data, *CASES[name], *common, f"seed={i % 2}")
        for i, name in enumerate(names)
    ]
    groups, alone = plan(cfgs)
    assert groups == [list(range(len(names)))] and not alone  # strategies and seeds differ: one group
    outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=True)
    assert [o.status for o in outcomes] == ["finished"] * len(names), [o.message for o in outcomes]
    for i, name in enumerate(names):
        lone = composed(tmp_path / "lone" / name, tiny_data, *CASES[name], *common, f"seed={i % 2}")
        simulate(lone)
        assert_same_run(tmp_path / "stacked" / name, tmp_path / "lone" / name)


GRID = {
    **{
        f"{name}_lr{lr}_b{beta}": [*CASES[name], f"strategy.client_lr={lr}", f"strategy.momentum={beta}"]
        for name in ("fedcm", "ghbm")
        for lr, beta in ((0.05, 0.5), (0.2, 0.9))
    },
    **{f"fedavgm_b{beta}": ["strategy=fedavgm", f"strategy.momentum={beta}"] for beta in (0.5, 0.9)},
    **{f"localupdate_lr{lr}": [*CASES["localupdate"], f"strategy.client_lr={lr}"] for lr in (0.05, 0.0)},
}


def test_a_learning_rate_and_beta_grid_trains_in_a_chunk_per_step_form_and_equals_lone_runs(tmp_path, tiny_data):
    """Jobs that differ in eta_l and beta share their chunks (per-client tensors), and so do FedAvgM's, FedCM's and
    GHBM's (one step form, theta - a g + c, with a per-client a and c): 2 chunks a round for 4 algorithms (LocalUpdate
    in its own), computed by 2 threads, and each job still equals its lone run bitwise."""
    common = ["model=logreg", "num_rounds=4", "eval_every=2", "engine.workers=2"]
    cfgs = [composed(tmp_path / "stacked" / name, tiny_data, *o, *common) for name, o in GRID.items()]
    with flwr_lines() as lines:
        outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=True)
    assert [o.status for o in outcomes] == ["finished"] * len(GRID), [o.message for o in outcomes]
    assert (
        f"[stacked] {len(GRID)} jobs as one program on cpu (stacked clients, jobs sharing chunks, 2 chunk threads)"
        in lines
    )
    assert any(line.startswith(f"[stacked] round 4/4: {3 * len(GRID)} clients of {len(GRID)} jobs in 2 chunks")
               for line in lines), lines  # fmt: skip
    for name, overrides in GRID.items():
        simulate(composed(tmp_path / "lone" / name, tiny_data, *overrides, *common))
        assert_same_run(tmp_path / "stacked" / name, tmp_path / "lone" / name)


def test_a_chunk_that_raises_on_a_chunk_thread_is_trained_one_by_one_and_the_others_equal_lone_runs(
    tmp_path, tiny_data, monkeypatch
):
    """A failing stacked chunk (here: every chunk of the GHBM job, computed on one of 2 threads) is logged by the
    group and its clients are trained by the ClientApp's own handler; the job finishes, and the other jobs' chunks
    are untouched."""
    from server.batched import grid as batched_grid

    real = batched_grid.stacked_local_train

    def failing_for_ghbm(model, clients, *args, **kwargs):
        if clients[0].cfg.algorithm == "ghbm":
            raise RuntimeError("a broken chunk")
        return real(model, clients, *args, **kwargs)

    monkeypatch.setattr(batched_grid, "stacked_local_train", failing_for_ghbm)
    common = ["model=logreg", "num_rounds=3", "engine.workers=2"]
    names = ("fedavg", "ghbm", "fedcm")
    cfgs = [composed(tmp_path / "stacked" / n, tiny_data, *CASES[n], *common) for n in names]
    with flwr_lines() as lines:
        outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=False)
    assert [o.status for o in outcomes] == ["finished"] * 3, [o.message for o in outcomes]
    failed = [line for line in lines if "a stacked chunk of 3 clients raised; training them one by one" in line]
    assert len(failed) == 3 and all("a broken chunk" in line for line in failed)  # one a round
    monkeypatch.setattr(batched_grid, "stacked_local_train", real)
    for name in ("fedavg", "fedcm"):
        simulate(composed(tmp_path / "lone" / name, tiny_data, *CASES[name], *common))
        assert_same_run(tmp_path / "stacked" / name, tmp_path / "lone" / name)


def test_a_diverging_job_leaves_the_group_and_the_others_go_on(tmp_path, tiny_data):
    common = ["model=logreg", "num_rounds=8", "engine.workers=1"]  # chunks one after another
    cfgs = [
        composed(tmp_path / "ok", tiny_data, *common),
        composed(tmp_path / "bad", tiny_data, *common, "strategy.server_lr=1e300"),
    ]
    outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=True)
    assert [o.status for o in outcomes] == ["finished", "diverged"]
    assert json.loads((tmp_path / "bad" / "status.json").read_text())["status"] == "diverged"
    simulate(composed(tmp_path / "lone", tiny_data, *common))
    assert_same_run(tmp_path / "ok", tmp_path / "lone")


def test_jobs_of_other_shapes_form_other_groups_and_a_ray_job_runs_alone(tmp_path, tiny_data):
    cfgs = [
        composed(tmp_path / "a", tiny_data, "model=logreg", "num_rounds=4"),
        composed(tmp_path / "b", tiny_data, "model=logreg", "num_rounds=5"),
        composed(tmp_path / "c", tiny_data, "model=logreg", "num_rounds=4", "seed=3"),
        composed(tmp_path / "d", tiny_data, "model=logreg", "num_rounds=4", "engine=ray"),
    ]
    groups, alone = plan(cfgs)
    assert groups == [[0, 2], [1]] and list(alone) == [3] and "engine=ray" in alone[3]
    assert shape_key(cfgs[0]) == shape_key(cfgs[2]) != shape_key(cfgs[1])
    assert plan(cfgs[:1] + cfgs[2:3] + cfgs[:1], max_jobs=2)[0] == [[0, 1], [2]]


@pytest.mark.parametrize("first", ["stacked", "batched"])
def test_a_checkpoint_passes_between_the_stacked_program_and_the_batched_engine(tmp_path, tiny_data, first):
    """Rounds 1-4 on one, resumed to 8 on the other: bitwise the uninterrupted batched run."""
    common = ["model=logreg", "strategy=ghbm", "strategy.tau=2", "checkpoint_every=4"]
    rounds = 4 if first == "stacked" else 8  # a group's jobs share their rounds
    partner = composed(tmp_path / "partner", tiny_data, *common, f"num_rounds={rounds}", "seed=1")
    half = composed(tmp_path / "run", tiny_data, *common, "num_rounds=4")
    rest = composed(tmp_path / "run", tiny_data, *common, "num_rounds=8", "resume=true")
    group = [half, partner] if first == "stacked" else [rest, partner]
    assert plan(group)[0] == [[0, 1]]
    if first == "batched":
        simulate(half)
    assert [o.status for o in run_jobs(group, share_chunks=True)] == ["finished"] * 2
    if first == "stacked":
        simulate(rest)
    simulate(composed(tmp_path / "whole", tiny_data, *common, "num_rounds=8"))
    a, b = np.load(tmp_path / "run" / "final_model.npz"), np.load(tmp_path / "whole" / "final_model.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)
    assert rows(tmp_path / "run") == rows(tmp_path / "whole")


def test_population_evaluations_of_a_round_are_one_pass_and_equal_lone_runs_to_rounding(tmp_path, tiny_data):
    """``pop_gap`` jobs (the convex study's columns) of two seeds: their evaluations of a round, round 0's and the
    window means' included, are done in one pass over the shared float64 data (4 models a pass). The pop_* columns
    equal the lone runs' to float64 rounding; the final models and every other column are bitwise the lone runs'."""
    common = ["model=logreg", "num_rounds=6", "eval_every=2", "eval_tail=0", "eval_average=2", "eval_train=true",
              "eval_gap=true", "client.weight_decay=1e-3", "client.augment=false"]  # fmt: skip
    jobs = {f"{name}_seed{seed}": [*CASES[name], f"seed={seed}"] for name in ("fedavg", "ghbm") for seed in (0, 1)}
    cfgs = [composed(tmp_path / "stacked" / name, tiny_data, *o, *common) for name, o in jobs.items()]
    with flwr_lines() as lines:
        outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=True)
    assert [o.status for o in outcomes] == ["finished"] * len(jobs), [o.message for o in outcomes]
    passes = [line for line in lines if "evaluations in" in line]
    assert passes == ["[stacked] 28 evaluations in 7 passes (those of a round together)"], passes  # round 0's too
    for name, overrides in jobs.items():
        log = (tmp_path / "stacked" / name / "run.log").read_text()  # its own lines only, every round's
        assert [other for other in jobs if f"stacked/{other}:" in log] == [name] and "[round 6/6]" in log
        assert "[stacked]" not in log  # the group's lines are the console's
        simulate(composed(tmp_path / "lone" / name, tiny_data, *overrides, *common))
        a, b = (
            np.load(tmp_path / "stacked" / name / "final_model.npz"),
            np.load(tmp_path / "lone" / name / "final_model.npz"),
        )
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
        stacked, lone = rows(tmp_path / "stacked" / name), rows(tmp_path / "lone" / name)
        assert [list(r) for r in stacked] == [list(r) for r in lone]
        assert any("avg_pop_gap" in r for r in lone)
        for r, s in zip(lone, stacked):
            for key, value in r.items():
                if "pop_loss" in key or "pop_gap" in key:
                    assert s[key] == pytest.approx(value, rel=1e-10, abs=1e-12), (name, r["round"], key)
                else:
                    assert s[key] == value, (name, r["round"], key)


def test_population_losses_without_a_gap_are_one_pass_per_evaluator_and_equal_lone_runs_bitwise(
    tmp_path, tiny_data, monkeypatch
):
    """``eval_train`` without ``pop_gap`` (paper 2's population loss): the jobs of one seed share an evaluator, and
    the population losses of their models of a round are one pass over the clients' batches; every column but the
    timings is bitwise the lone runs'."""
    common = ["model=logreg", "num_rounds=4", "eval_every=2", "eval_tail=0", "eval_train=true", "seed=0"]
    jobs = {name: CASES[name] for name in ("fedavg", "fedcm", "ghbm")}
    cfgs = [composed(tmp_path / "stacked" / name, tiny_data, *o, *common) for name, o in jobs.items()]
    passes, populations = [], Evaluator.populations

    def counted(self, models):
        passes.append(len(models))
        return populations(self, models)

    monkeypatch.setattr(Evaluator, "populations", counted)
    with flwr_lines() as lines:
        outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=True)
    assert [o.status for o in outcomes] == ["finished"] * len(jobs), [o.message for o in outcomes]
    assert [line for line in lines if "evaluations in" in line] == [
        "[stacked] 9 evaluations in 3 passes (those of a round together)"
    ]
    assert passes == [3, 3, 3]  # rounds 0, 2 and 4: the three jobs' models in one pass over the clients' batches
    for name, overrides in jobs.items():
        simulate(composed(tmp_path / "lone" / name, tiny_data, *overrides, *common))
        stacked, lone = rows(tmp_path / "stacked" / name), rows(tmp_path / "lone" / name)
        assert stacked == lone and all("pop_loss" in r for r in lone if r["round"] % 2 == 0)


def test_a_jobs_warning_on_the_console_names_its_job_and_its_run_log_keeps_the_line(tmp_path):
    """Every job of a group logs the same warnings (a partition it shares, an f* of its seed): on the console each
    is led by its job; the job's run.log and every other line stay as they are, and so does the handler afterwards."""
    from server.stacked import launch

    flwr = logging.getLogger("flwr")
    screen = io.StringIO()
    console = logging.StreamHandler(screen)
    console.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    file = logging.FileHandler(tmp_path / "run.log")
    flwr.addHandler(console)
    flwr.addHandler(file)

    def in_thread(name, *lines):
        thread = threading.Thread(target=lambda: [flwr.log(*line) for line in lines], name=name)
        thread.start()
        thread.join()

    try:
        with launch._quiet_jobs({f"{launch.JOB_THREAD}3": "job 3 (runs/3)"}):
            in_thread(f"{launch.JOB_THREAD}3", (logging.WARNING, "f* is %s", "wrong"), (logging.INFO, "round 1"))
            failed = threading.Thread(  # a job's own failure line names it already, as _Job logs it
                target=flwr.error,
                args=("job 3 (runs/3) failed",),
                kwargs={"extra": {launch.GROUP_MARK: True}},
                name=f"{launch.JOB_THREAD}3",
            )
            failed.start()
            failed.join()
            flwr.warning("the group's own")
        in_thread(f"{launch.JOB_THREAD}3", (logging.WARNING, "after the group"))
    finally:
        flwr.removeHandler(console)
        flwr.removeHandler(file)
        file.close()
    assert screen.getvalue().splitlines() == [
        "WARNING: job 3 (runs/3): f* is wrong",
        "ERROR: job 3 (runs/3) failed",
        "WARNING: the group's own",
        "WARNING: after the group",
    ]
    assert (tmp_path / "run.log").read_text().splitlines() == [
        "f* is wrong",
        "round 1",
        "job 3 (runs/3) failed",
        "the group's own",
        "after the group",
    ]
