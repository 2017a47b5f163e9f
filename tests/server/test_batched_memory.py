"""Stacked chunks that run out of memory (server/batched/memory.py): a chunk is trained again in halves and the run
stacks at most what fit from then on, with the same results as a run with that chunk size; a client that does not
fit alone fails its run (in a stacked group, its job only) with one line naming the model, the batch and the device.

Out of memory is made real where it is wanted: the stacked step of a chunk above a size (or of one job) first asks
torch's CPU allocator for an impossible block, and gets the allocator's own error."""

import copy
import json

import pytest
import torch
from test_stacked_program import assert_same_run, composed, flwr_lines

import server.batched.grid as grid_module
from server.batched.memory import ClientDoesNotFit, is_out_of_memory
from server.run.cli import simulate
from server.stacked.launch import run_jobs

pytestmark = pytest.mark.e2e
COMMON = ["model=logreg", "num_clients=8", "participation.fraction=0.5", "num_rounds=4", "eval_every=2"]


def allocator_fails(when):
    """The real stacked step, after a real allocation failure for the chunks ``when`` picks; the chunk sizes seen."""
    real, seen = grid_module.stacked_local_train, []

    def step(model, inputs, *args, **kwargs):
        seen.append(len(inputs))
        if when(inputs):
            torch.empty(2**50, dtype=torch.uint8)  # raises: the CPU allocator cannot give a petabyte
        return real(model, inputs, *args, **kwargs)

    return step, seen


def test_the_allocators_errors_are_recognised():
    with pytest.raises(RuntimeError) as cpu:
        torch.empty(2**50, dtype=torch.uint8)
    assert is_out_of_memory(cpu.value)
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_chunk_out_of_memory_is_trained_in_halves_and_equals_a_run_with_that_chunk_size(
    tmp_path, tiny_data, monkeypatch
):
    step, seen = allocator_fails(lambda inputs: len(inputs) > 2)
    monkeypatch.setattr(grid_module, "stacked_local_train", step)
    with flwr_lines() as lines:
        simulate(composed(tmp_path / "halved", tiny_data, *COMMON))
    assert seen == [4, 2, 2] + [2, 2] * 3  # round 1: 4 clients fail, then two halves; then chunks of 2
    assert sum("a stacked chunk of 4 clients ran out of cpu memory" in line for line in lines) == 1
    assert sum("stacking at most 2 clients at a time from now on" in line for line in lines) == 1
    monkeypatch.undo()
    simulate(composed(tmp_path / "chunks2", tiny_data, *COMMON, "engine.chunk_size=2"))
    assert_same_run(tmp_path / "halved", tmp_path / "chunks2")


def test_a_client_that_does_not_fit_alone_fails_its_run_with_one_line(tmp_path, tiny_data, monkeypatch):
    step, _ = allocator_fails(lambda inputs: True)
    monkeypatch.setattr(grid_module, "stacked_local_train", step)
    with pytest.raises(
        ClientDoesNotFit,
        match=r"^'client.batch_size': one client of logreg with batches of 8 does not "
        r"fit in the memory of cpu even alone \(.*can't allocate memory.*\); lower client.batch_size$",
    ):
        simulate(composed(tmp_path / "lone", tiny_data, *COMMON))  # fmt: skip
    status = json.loads((tmp_path / "lone" / "status.json").read_text())
    assert status["status"] == "failed" and status["round"] == 0
    assert status["reason"].startswith("invalid configuration: 'client.batch_size': one client of logreg")
    (outcome,) = run_jobs([composed(tmp_path / "multirun", tiny_data, *COMMON)])  # a multirun's lone job: the same
    assert outcome.status == "invalid"  # exit 2, as the lone run's
    assert outcome.message.startswith(f"{tmp_path / 'multirun'}: invalid configuration: 'client.batch_size': one")


def test_in_a_group_only_the_job_whose_client_does_not_fit_fails(tmp_path, tiny_data, monkeypatch):
    cfgs = [composed(tmp_path / "stacked" / f"seed{s}", tiny_data, *COMMON, f"seed={s}") for s in (0, 1)]
    step, _ = allocator_fails(lambda inputs: any(c.cfg.seed == 1 for c in inputs))
    monkeypatch.setattr(grid_module, "stacked_local_train", step)
    outcomes = run_jobs(copy.deepcopy(cfgs), share_chunks=True)  # both jobs' clients in one chunk, then halves
    assert [o.status for o in outcomes] == ["finished", "invalid"], [o.message for o in outcomes]
    run_dir = tmp_path / "stacked" / "seed1"
    assert outcomes[1].message.startswith(f"job 1 ({run_dir}): invalid configuration: 'client.batch_size': one client")
    assert json.loads((run_dir / "status.json").read_text())["status"] == "failed"
    monkeypatch.undo()
    simulate(composed(tmp_path / "lone" / "seed0", tiny_data, *COMMON, "seed=0"))
    assert_same_run(tmp_path / "stacked" / "seed0", tmp_path / "lone" / "seed0")
