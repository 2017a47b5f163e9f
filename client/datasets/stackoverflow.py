"""Stack Overflow (TFF; Reddi et al. 2021, App. C.4–C.5), seed 001 §8.4: one natural client per user.

No Hugging Face copy of TFF's federated Stack Overflow is published, so ``data.root`` must hold one in TFF's
schema, one row per post sentence: ``client_id`` (the user), ``tokens`` (space-separated, lower-cased words),
``title`` (the question's title) and ``tags`` (``|``-separated). Vocabularies are built from the training
split: the 10,000 most frequent words and the 500 most frequent tags (ties broken alphabetically).

- ``stackoverflow_nwp``: next-word prediction on ``tokens``: ids 1..10,000 for the vocabulary, pad 0, oov
  10,001, bos 10,002, eos 10,003 (10,004 outputs); each sentence is bos + its first 20 words (+ eos when
  shorter), padded to 21 ids; the model reads ids[:-1] and predicts ids[1:].
- ``stackoverflow_tp``: tag prediction: input the bag of the in-vocabulary words of ``tokens`` and ``title``
  normalised to sum 1, target the multi-hot vector of the in-vocabulary tags; one-vs-all logistic loss.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from client.datacheck import DataSourceError
from client.datasets.base import ENCODE_CHUNK, TaskSpec
from client.examples import BagOfWordsExamples, NextWordExamples

VOCAB_SIZE, NUM_TAGS, SEQ_LEN = 10_000, 500, 20
PAD, OOV, BOS, EOS = 0, VOCAB_SIZE + 1, VOCAB_SIZE + 2, VOCAB_SIZE + 3
NWP_OUTPUTS = VOCAB_SIZE + 4
COLUMNS = {"client_id": "string user id", "tokens": "space-separated words", "title": "question title",
           "tags": "'|'-separated tags"}


def _strings(values: Any, column: str) -> list[str]:
    if any(not isinstance(v, str) for v in values):
        raise DataSourceError(f"column {column!r} must hold strings")
    return values


def _words(rows: Mapping[str, Any], with_title: bool) -> list[list[str]]:
    tokens = _strings(rows["tokens"], "tokens")
    if not with_title:
        return [t.split() for t in tokens]
    return [t.split() + s.split() for t, s in zip(tokens, _strings(rows["title"], "title"))]


def _tags(rows: Mapping[str, Any]) -> list[list[str]]:
    return [[t for t in s.split("|") if t] for s in _strings(rows["tags"], "tags")]


def _top(counter: Counter, k: int) -> dict[str, int]:
    ranked = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return {w: i for i, (w, _) in enumerate(ranked)}


def _prepare(dataset: Any, with_title: bool) -> dict[str, Any]:
    words, tags = Counter(), Counter()
    for rows in dataset.iter(batch_size=ENCODE_CHUNK):
        for ws in _words(rows, with_title):
            words.update(ws)
        if with_title:
            for ts in _tags(rows):
                tags.update(ts)
    vocab = _top(words, VOCAB_SIZE)
    meta: dict[str, Any] = {"vocab": list(vocab)}
    if with_title:
        tag_ids = _top(tags, NUM_TAGS)
        meta.update(tags=list(tag_ids), num_outputs=NUM_TAGS)
    else:
        meta.update(num_outputs=NWP_OUTPUTS)
    return meta


def _lookup(meta: Mapping[str, Any], key: str) -> dict[str, int]:
    cache = meta.get(f"_{key}_index")  # built once per process
    if cache is None:
        cache = {w: i for i, w in enumerate(meta[key])}
        meta[f"_{key}_index"] = cache  # type: ignore[index]
    return cache


# --------------------------------------------------------------------------- next-word prediction
def _nwp_arrays(meta: Mapping[str, Any], n: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {"ids": ((n, SEQ_LEN + 1), np.int32)}


def _nwp_encode(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    vocab = _lookup(meta, "vocab")
    sentences = _words(rows, with_title=False)
    ids = np.full((len(sentences), SEQ_LEN + 1), PAD, dtype=np.int32)
    for i, ws in enumerate(sentences):
        seq = [BOS] + [vocab.get(w, OOV - 1) + 1 for w in ws[:SEQ_LEN]]
        if len(ws) < SEQ_LEN:
            seq.append(EOS)
        ids[i, : len(seq)] = seq
    return {"ids": ids}


def _nwp_examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> NextWordExamples:
    return NextWordExamples(arrays["ids"], PAD, (PAD, OOV, BOS, EOS))


# --------------------------------------------------------------------------- tag prediction
def _tp_sizes(meta: Mapping[str, Any]) -> tuple[int, int]:
    return int(meta["num_words"]), int(meta["num_tag_ids"])


def _tp_prepare(dataset: Any) -> dict[str, Any]:
    meta = _prepare(dataset, with_title=True)
    vocab, tags = set(meta["vocab"]), set(meta["tags"])
    num_words = num_tags = 0
    for rows in dataset.iter(batch_size=ENCODE_CHUNK):
        num_words += sum(w in vocab for ws in _words(rows, True) for w in ws)
        num_tags += sum(t in tags for ts in _tags(rows) for t in ts)
    meta.update(num_words=num_words, num_tag_ids=num_tags)
    return meta


def _tp_arrays(meta: Mapping[str, Any], n: int) -> dict[str, tuple[tuple[int, ...], Any]]:
    num_words, num_tags = _tp_sizes(meta)
    return {"words": ((num_words,), np.int16), "words_ptr": ((n + 1,), np.int64),
            "tags": ((num_tags,), np.int16), "tags_ptr": ((n + 1,), np.int64)}


def _tp_encode(rows: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, np.ndarray]:
    vocab, tag_index = _lookup(meta, "vocab"), _lookup(meta, "tags")
    words = [[vocab[w] for w in ws if w in vocab] for ws in _words(rows, True)]
    tags = [[tag_index[t] for t in ts if t in tag_index] for ts in _tags(rows)]
    flat = lambda lists: np.asarray([v for vs in lists for v in vs], dtype=np.int16)  # noqa: E731
    return {"words": flat(words), "words_ptr": np.asarray([len(w) for w in words], dtype=np.int64),
            "tags": flat(tags), "tags_ptr": np.asarray([len(t) for t in tags], dtype=np.int64)}


def _tp_examples(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], augment: bool) -> BagOfWordsExamples:
    return BagOfWordsExamples(arrays["words_ptr"], arrays["words"], arrays["tags_ptr"], arrays["tags"],
                              VOCAB_SIZE, NUM_TAGS)


NWP_SPEC = TaskSpec(name="stackoverflow_nwp", hub_name=None, partition_by="client_id", columns=COLUMNS,
                    arrays=_nwp_arrays, encode=_nwp_encode, examples=_nwp_examples,
                    prepare=lambda dataset: _prepare(dataset, with_title=False))
TP_SPEC = TaskSpec(name="stackoverflow_tp", hub_name=None, partition_by="client_id", columns=COLUMNS,
                   arrays=_tp_arrays, encode=_tp_encode, examples=_tp_examples, prepare=_tp_prepare)
