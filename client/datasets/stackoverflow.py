"""Stack Overflow (TFF; Reddi et al. 2021, App. C.4–C.5), paper 2 §8.4: one natural client per user.

No Hugging Face copy of TFF's federated Stack Overflow is published, so ``data.root`` must hold one in TFF's
schema, one row per post sentence: ``client_id`` (the user), ``tokens`` (space-separated, lower-cased words),
``title`` (the question's title) and ``tags`` (``|``-separated). Vocabularies are built from the training
split: the 10,000 most frequent words and the 500 most frequent tags (ties broken alphabetically).

- ``stackoverflow_nwp``: next-word prediction on ``tokens``: ids 1..10,000 for the vocabulary, pad 0, oov
  10,001, bos 10,002, eos 10,003 (10,004 outputs); each sentence is bos + its first 20 words (+ eos when
  shorter), padded to 21 ids; the model reads ids[:-1] and predicts ids[1:].
- ``stackoverflow_tp``: tag prediction: input the bag of the in-vocabulary words of ``tokens`` and ``title``
  normalised to sum 1, target the multi-hot vector of the in-vocabulary tags; one-vs-all logistic loss.

Words are the pieces of a string between runs of whitespace (Python's ``str.split()``: the same Unicode
whitespace), tags the non-empty pieces between ``|``. Both tasks read and encode Arrow batches with
``pyarrow.compute`` (:mod:`client.datasets.arrow_text`): the full copy's 135.8M sentences in minutes, not hours
(docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from client.datasets.base import TaskSpec
from client.examples import BagOfWordsExamples, NextWordExamples

if TYPE_CHECKING:  # pyarrow is imported only while a cache entry is built (reading one does not need it)
    import pyarrow as pa

    from client.datasets.arrow_text import Pieces

VOCAB_SIZE, NUM_TAGS, SEQ_LEN = 10_000, 500, 20
PAD, OOV, BOS, EOS = 0, VOCAB_SIZE + 1, VOCAB_SIZE + 2, VOCAB_SIZE + 3
NWP_OUTPUTS = VOCAB_SIZE + 4
COLUMNS = {
    "client_id": "string user id",
    "tokens": "space-separated words",
    "title": "question title",
    "tags": "'|'-separated tags",
}


def _words(rows: pa.Table, with_title: bool) -> Pieces:
    """Each row's words: those of ``tokens`` (and then of ``title``), flat, in row order."""
    from client.datasets import arrow_text as text

    words = text.pieces(rows, "tokens")
    return text.concat_rows(words, text.pieces(rows, "title")) if with_title else words


def _prepare(dataset: Any, with_title: bool) -> dict[str, Any]:
    from client.datasets import arrow_text as text

    words, tags = text.Counts(), text.Counts()
    for rows in text.batches(dataset):
        words.add(_words(rows, with_title).values)
        if with_title:
            tags.add(text.pieces(rows, "tags", "|").values)
    meta: dict[str, Any] = {"vocab": words.top(VOCAB_SIZE)}
    if with_title:
        meta.update(tags=tags.top(NUM_TAGS), num_outputs=NUM_TAGS)
    else:
        meta.update(num_outputs=NWP_OUTPUTS)
    return meta


# --------------------------------------------------------------------------- next-word prediction
def _nwp_arrays(meta: Mapping[str, Any], n: int, dataset: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {"ids": ((n, SEQ_LEN + 1), np.int32)}


def _nwp_encode(rows: pa.Table, meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    from client.datasets import arrow_text as text

    words = _words(rows, with_title=False)
    first = words.position < SEQ_LEN
    ranks = text.lookup(words.values, text.vocabulary(meta, "vocab"))[first]
    ids = np.full((rows.num_rows, SEQ_LEN + 1), PAD, dtype=np.int32)
    ids[:, 0] = BOS
    ids[words.row[first], words.position[first] + 1] = np.where(ranks >= 0, ranks + 1, OOV)
    short = np.flatnonzero(words.counts < SEQ_LEN)
    ids[short, words.counts[short] + 1] = EOS
    return {"ids": ids}


def _nwp_examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> NextWordExamples:
    return NextWordExamples(arrays["ids"], PAD, (PAD, OOV, BOS, EOS))


# --------------------------------------------------------------------------- tag prediction
def _tp_ids(rows: pa.Table, meta: Mapping[str, Any]) -> tuple[Pieces, np.ndarray, Pieces, np.ndarray]:
    """(words, their vocabulary ranks, tags, their tag ranks); rank -1: not in the vocabulary."""
    from client.datasets import arrow_text as text

    words, tags = _words(rows, with_title=True), text.pieces(rows, "tags", "|")
    return (
        words,
        text.lookup(words.values, text.vocabulary(meta, "vocab")),
        tags,
        text.lookup(tags.values, text.vocabulary(meta, "tags")),
    )


def _tp_arrays(meta: Mapping[str, Any], n: int, dataset: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The ragged arrays' sizes: the in-vocabulary words and tags of this split (one pass over its n rows; a
    natural-id partition covers every row)."""
    from client.datasets import arrow_text as text

    num_words = num_tags = 0
    for rows in text.batches(dataset):
        _, word_ids, _, tag_ids = _tp_ids(rows, meta)
        num_words += int(np.count_nonzero(word_ids >= 0))
        num_tags += int(np.count_nonzero(tag_ids >= 0))
    return {
        "words": ((num_words,), np.int16),
        "words_ptr": ((n + 1,), np.int64),
        "tags": ((num_tags,), np.int16),
        "tags_ptr": ((n + 1,), np.int64),
    }


def _tp_encode(rows: pa.Table, meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    words, word_ids, tags, tag_ids = _tp_ids(rows, meta)
    known_words, known_tags = word_ids >= 0, tag_ids >= 0
    return {
        "words": word_ids[known_words].astype(np.int16),
        "tags": tag_ids[known_tags].astype(np.int16),
        "words_ptr": np.bincount(words.row[known_words], minlength=rows.num_rows).astype(np.int64),
        "tags_ptr": np.bincount(tags.row[known_tags], minlength=rows.num_rows).astype(np.int64),
    }


def _tp_examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> BagOfWordsExamples:
    return BagOfWordsExamples(
        arrays["words_ptr"], arrays["words"], arrays["tags_ptr"], arrays["tags"], VOCAB_SIZE, NUM_TAGS
    )


NWP_SPEC = TaskSpec(
    name="stackoverflow_nwp",
    hub_name=None,
    partition_by="client_id",
    columns=COLUMNS,
    arrays=_nwp_arrays,
    encode=_nwp_encode,
    examples=_nwp_examples,
    prepare=lambda dataset: _prepare(dataset, with_title=False),
    arrow=True,
)
TP_SPEC = TaskSpec(
    name="stackoverflow_tp",
    hub_name=None,
    partition_by="client_id",
    columns=COLUMNS,
    arrays=_tp_arrays,
    encode=_tp_encode,
    examples=_tp_examples,
    prepare=lambda dataset: _prepare(dataset, with_title=True),
    arrow=True,
)
