"""Shakespeare (Caldas et al. 2018, LEAF), paper 2 §8 / App. C: next-character prediction, one natural client
per speaking role (a character in a play). Hub copy ``flwrlabs/shakespeare`` (LEAF's preprocessing: columns
``character_id``, ``x`` = 80 characters, ``y`` = the next character), partitioned by ``character_id``.

Characters map to LEAF's 80-letter alphabet; any other character maps to one out-of-vocabulary id (81 ids).
The model reads the 80 characters and predicts ``y`` (LEAF's task); TFF's version, which paper 2 used,
predicts every position of 80-character chunks with a 90-id vocabulary (Reddi et al. 2021, App. C.3).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from client.datacheck import DataSourceError
from client.datasets.base import TaskSpec
from client.examples import SequenceExamples

LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
OOV = len(LETTERS)
VOCAB_SIZE = len(LETTERS) + 1
SEQ_LEN = 80
_TABLE = np.full(256, OOV, dtype=np.uint8)
_TABLE[np.frombuffer(LETTERS.encode("latin-1"), dtype=np.uint8)] = np.arange(len(LETTERS), dtype=np.uint8)


def char_ids(text: str) -> np.ndarray:
    """Ids of the characters of ``text`` (OOV for anything outside LEAF's alphabet)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return np.where(codes < 256, _TABLE[np.minimum(codes, 255)], OOV).astype(np.uint8)


def _arrays(meta: Mapping[str, Any], n: int, dataset: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {"x": ((n, SEQ_LEN), np.uint8), "y": ((n,), np.uint8)}


def _encode(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    x = np.empty((len(rows["x"]), SEQ_LEN), dtype=np.uint8)
    for i, text in enumerate(rows["x"]):
        if not isinstance(text, str) or len(text) != SEQ_LEN:
            got = len(text) if isinstance(text, str) else type(text).__name__
            raise DataSourceError(f"column 'x': a row holds {got} characters, expected {SEQ_LEN}")
        x[i] = char_ids(text)
    y = np.empty(len(rows["y"]), dtype=np.uint8)
    for i, text in enumerate(rows["y"]):
        if not isinstance(text, str) or len(text) != 1:
            raise DataSourceError(f"column 'y': a row holds {text!r}, expected one character")
        y[i] = char_ids(text)[0]
    return {"x": x, "y": y}


def _examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> SequenceExamples:
    return SequenceExamples(arrays["x"], arrays["y"])


SPEC = TaskSpec(
    name="shakespeare",
    hub_name="flwrlabs/shakespeare",
    partition_by="character_id",
    columns={"character_id": "string role id", "x": "80 characters", "y": "the next character"},
    arrays=_arrays,
    encode=_encode,
    examples=_examples,
    prepare=lambda dataset: {"num_outputs": VOCAB_SIZE},
    hub_kwargs={"na_filter": False},  # the hub copy is one CSV: no field read as missing (a local CSV copy too)
)
