"""A task's examples as the training loop sees them: batches, loss and a quality count.

``client.train`` runs every algorithm on an :class:`Examples` object, so one loop serves every task:

- :class:`ImageExamples` — uint8 NHWC images + int labels, cross-entropy, top-1 accuracy; CIFAR-10 (paper 1
  §IV-B), FEMNIST and CIFAR-100 (paper 2 §8). ``augment`` picks the random crop + flip of ``client.augment``.
- :class:`SequenceExamples` — token ids → one next token (Shakespeare, paper 2 §8 / App. C: 80 characters in,
  the next one out), cross-entropy, accuracy.
- :class:`NextWordExamples` — (N, L+1) token ids, predict every next token (Stack Overflow NWP): cross-entropy
  over non-pad positions, accuracy without pad/oov/bos/eos (Reddi et al. 2021, App. C).
- :class:`BagOfWordsExamples` — ragged word ids and tag ids (Stack Overflow TP): the normalised bag of words
  against a multi-hot tag vector, one-vs-all logistic loss (mean binary cross-entropy over tags), recall@5.

Every class holds views of memory-mapped arrays; a batch is materialised only when drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from client.augment import prepare_batch


class Examples(Protocol):
    """One client's (or the server's) examples."""

    def __len__(self) -> int: ...

    def batch(
        self, idx: np.ndarray, device: torch.device, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of rows ``idx``; ``generator`` is given only for augmented training batches."""
        ...

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(summed loss, number of loss terms) of a batch; the training loss is their ratio."""
        ...

    def correct(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        """(hits, number of scored items): accuracy (or recall@5) is their ratio."""
        ...


class _ClassificationLoss:
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        return F.cross_entropy(outputs, targets, reduction="sum"), len(targets)

    def correct(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        return float((outputs.argmax(1) == targets).sum()), len(targets)


class ImageExamples(_ClassificationLoss):
    """uint8 images (n, H, W, C) and labels; normalised per channel, augmented when ``augment``.

    With ``rows``, the images are ``x[rows]``, read on first use of :attr:`x`: a client of the batched engine whose
    float copy is already cached (``client.stacked``) never reads them again; :attr:`source` and :attr:`rows` keep
    the whole array and the rows (the stacked step's clients share one float copy of the split).
    """

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        mean: Sequence[float],
        std: Sequence[float],
        augment: bool = True,
        rows: np.ndarray | None = None,
    ) -> None:
        self._x, self._rows = x, rows
        self.source, self.rows = x, rows
        self.y, self.mean, self.std, self.augment = y, mean, std, augment

    @property
    def x(self) -> np.ndarray:
        """The images (n, H, W, C)."""
        if self._rows is not None:
            self._x, self._rows = self._x[self._rows], None
        return self._x

    def __len__(self) -> int:
        return len(self.y)

    def batch(
        self, idx: np.ndarray, device: torch.device, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = prepare_batch(self.x[idx], self.mean, self.std, device, generator if self.augment else None)
        return inputs, torch.from_numpy(np.asarray(self.y[idx], dtype=np.int64)).to(device)


class SequenceExamples(_ClassificationLoss):
    """Token ids (n, L) and the next token (n,) (Shakespeare, LEAF's x/y)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def batch(
        self, idx: np.ndarray, device: torch.device, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.from_numpy(np.asarray(self.x[idx], dtype=np.int64)).to(device),
            torch.from_numpy(np.asarray(self.y[idx], dtype=np.int64)).to(device),
        )


class NextWordExamples:
    """(n, L+1) token ids: input ids[:, :-1], targets ids[:, 1:]; ``pad`` positions carry no loss and
    ``special`` ids (pad, oov, bos, eos) are not scored for accuracy (Reddi et al. 2021, App. C.5)."""

    def __init__(self, ids: np.ndarray, pad: int, special: Sequence[int]) -> None:
        self.ids, self.pad, self.special = ids, int(pad), tuple(int(s) for s in special)

    def __len__(self) -> int:
        return len(self.ids)

    def batch(
        self, idx: np.ndarray, device: torch.device, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.from_numpy(np.asarray(self.ids[idx], dtype=np.int64)).to(device)
        return ids[:, :-1], ids[:, 1:]

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        mask = targets != self.pad
        terms = F.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="none")
        return (terms * mask.flatten()).sum(), max(int(mask.sum()), 1)

    def correct(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        scored = torch.ones_like(targets, dtype=torch.bool)
        for s in self.special:
            scored &= targets != s
        return float(((outputs.argmax(-1) == targets) & scored).sum()), int(scored.sum())


class BagOfWordsExamples:
    """Ragged word ids and tag ids (CSR: ``*_ptr`` offsets into flat ``*_ids``, rows of this client only):
    input = bag of words / number of words (Reddi et al. 2021, App. C.5), target = multi-hot tags."""

    def __init__(
        self,
        word_ptr: np.ndarray,
        word_ids: np.ndarray,
        tag_ptr: np.ndarray,
        tag_ids: np.ndarray,
        vocab_size: int,
        num_tags: int,
    ) -> None:
        self.word_ptr, self.word_ids, self.tag_ptr, self.tag_ids = word_ptr, word_ids, tag_ptr, tag_ids
        self.vocab_size, self.num_tags = int(vocab_size), int(num_tags)

    def __len__(self) -> int:
        return len(self.word_ptr) - 1

    def _dense(self, ptr: np.ndarray, ids: np.ndarray, idx: np.ndarray, width: int, mean: bool) -> torch.Tensor:
        out = np.zeros((len(idx), width), dtype=np.float32)
        for row, i in enumerate(idx):
            values = np.asarray(ids[ptr[i] - ptr[0] : ptr[i + 1] - ptr[0]])
            np.add.at(out[row], values, 1.0)
            if mean and len(values):
                out[row] /= len(values)
        return torch.from_numpy(out)

    def batch(
        self, idx: np.ndarray, device: torch.device, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._dense(self.word_ptr, self.word_ids, idx, self.vocab_size, mean=True)
        y = self._dense(self.tag_ptr, self.tag_ids, idx, self.num_tags, mean=False).clamp_(max=1.0)
        return x.to(device), y.to(device)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
        per_example = F.binary_cross_entropy_with_logits(outputs, targets, reduction="none").mean(1)
        return per_example.sum(), len(targets)

    def correct(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        """Recall@5: the share of an example's tags among its 5 highest scores, over examples with tags."""
        k = min(5, outputs.shape[1])
        top = torch.zeros_like(targets).scatter_(1, outputs.topk(k, dim=1).indices, 1.0)
        num_tags = targets.sum(1)
        has = num_tags > 0
        recall = (top * targets).sum(1)[has] / num_tags[has]
        return float(recall.sum()), int(has.sum())
