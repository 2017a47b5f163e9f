"""Models of paper 2's tasks (§8; App. C, which follows Reddi et al. 2021, App. C / Table 5-8).

Parameter counts (PyTorch; an LSTM has two bias vectors per gate where Keras has one) are asserted in
tests/client/test_natural_models.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from client.tasks import TASK_MODELS

GN_GROUPS = 2  # Hsieh et al. (2020) / Reddi et al. (2021): GroupNorm with 2 groups in place of BatchNorm


class FemnistCNN(nn.Module):
    """The CNN of McMahan et al. (2017) (paper 2 §8): conv5x5(1->32, same) ReLU maxpool2, conv5x5(32->64,
    same) ReLU maxpool2, FC 3136->512 ReLU, FC 512->62. 1,690,046 parameters at 62 classes."""

    def __init__(self, num_classes: int = 62) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def resnet18_gn(num_classes: int = 100) -> nn.Module:
    """ResNet-18 (He et al. 2016, torchvision's layout) with GroupNorm(2) for BatchNorm (paper 2 §8, Reddi
    et al. 2021 App. C.2). 11,227,812 parameters at 100 classes; no buffers."""
    from torchvision.models import resnet18

    return resnet18(num_classes=num_classes, norm_layer=lambda channels: nn.GroupNorm(GN_GROUPS, channels))


class CharLSTM(nn.Module):
    """Shakespeare next-character model (paper 2 §8: 2 LSTM layers; Reddi et al. 2021 App. C.3 sizes):
    embedding 8, two LSTM layers of 256 units, dense to the vocabulary, read at the last position.
    820,185 parameters at 81 characters."""

    def __init__(self, vocab_size: int = 81, embed: int = 8, hidden: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(x))
        return self.out(hidden[:, -1])


class OneVsAllLogReg(nn.Module):
    """Stack Overflow tag prediction (paper 2 §8, convex): one logistic regression per tag on the normalised
    bag of words, 10,000 words -> 500 tags. 5,000,500 parameters. Loss: mean binary cross-entropy over tags
    (``client.examples.BagOfWordsExamples``)."""

    def __init__(self, num_tags: int = 500, vocab_size: int = 10_000) -> None:
        super().__init__()
        self.linear = nn.Linear(vocab_size, num_tags)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class WordLSTM(nn.Module):
    """Stack Overflow next-word model (paper 2 §8: 1 LSTM layer; Reddi et al. 2021 App. C.5 sizes): embedding
    96 over 10,004 ids, LSTM 670, dense 96, dense 10,004, at every position. 4,053,428 parameters (Keras:
    4,050,748, one LSTM bias)."""

    def __init__(self, vocab_size: int = 10_004, embed: int = 96, hidden: int = 670) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, embed)
        self.out = nn.Linear(embed, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(x))
        return self.out(self.proj(hidden))


def build_task_model(name: str, num_outputs: int) -> nn.Module:
    """One of :data:`TASK_MODELS` with ``num_outputs`` classes, characters, tags or word ids."""
    if name == "femnist_cnn":
        return FemnistCNN(num_outputs)
    if name == "resnet18":
        return resnet18_gn(num_outputs)
    if name == "char_lstm":
        return CharLSTM(num_outputs)
    if name == "so_logreg":
        return OneVsAllLogReg(num_outputs)
    if name == "so_lstm":
        return WordLSTM(num_outputs)
    raise ValueError(f"unknown model {name!r}; expected one of {TASK_MODELS}")
