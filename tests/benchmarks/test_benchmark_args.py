"""Benchmark scripts refuse bad arguments in one line (exit 2) before any work: a missing data path was a stack
trace, a zero count ran on (``validation_cost --clients 0`` did not end), an unknown model was Hydra's trace."""

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    "module, argv, message",
    [
        ("client_throughput", ["--source", "/nonexistent"], "--source: no CIFAR-10 folder or .tar.gz at /nonexistent"),
        ("client_throughput", ["--source", "/nonexistent", "--clients", "0"], "--clients must be >= 1"),
        ("loss_before", ["--data", "/nonexistent"], "--data: no CIFAR-10 folder or .tar.gz at /nonexistent"),
        ("loss_before", ["--data", "/nonexistent", "--repeats", "0"], "--repeats must be >= 1"),
        ("population_eval", ["--data", "/nonexistent"], "--data: no CIFAR-10 folder or .tar.gz at /nonexistent"),
        ("validation_cost", ["--clients", "0"], "--clients, --examples, --threads and --repeats must be >= 1"),
        ("client_host", ["--model", "foo"], "argument --model: invalid choice: 'foo'"),
    ],
)
def test_bad_arguments_are_one_line(module, argv, message, monkeypatch, capsys):
    main = importlib.import_module(f"benchmarks.{module}").main
    monkeypatch.setattr(sys, "argv", [f"{module}.py", *argv])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and message in err and "Traceback" not in err
