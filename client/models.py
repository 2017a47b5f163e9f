"""Models of paper 1 §IV-B: the LeNet-5-like CNN of Hsu et al. (2019) and ResNet-20 (He et al., 2016,
CIFAR variant, following Idelbayev's ``resnet.py``) with GroupNorm (Wu & He, 2018) instead of BatchNorm; and
multinomial logistic regression on the normalised pixels, a convex objective with an exact optimum.

GroupNorm uses ``GN_GROUPS = 2`` groups in every layer (as in common FL code, e.g. Hsieh et al. 2020 /
FedML); it is affine, so it has the same 2*C parameters as BatchNorm and no buffers: a model's
``state_dict`` holds only trainable parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from client.task_models import build_task_model
from client.tasks import TASK_MODELS

MODELS = ("cnn", "resnet20", "logreg")
GN_GROUPS = 2


class LeNetCNN(nn.Module):
    """conv5x5(3->64) ReLU maxpool2, conv5x5(64->64) ReLU maxpool2, FC 1600->384->192->C (797,962 params at C=10).

    Convolutions are unpadded: 32 -> 28 -> 14 -> 10 -> 5, hence 64 * 5 * 5 = 1600 features.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 5)
        self.conv2 = nn.Conv2d(64, 64, 5)
        self.fc1 = nn.Linear(64 * 5 * 5, 384)
        self.fc2 = nn.Linear(384, 192)
        self.fc3 = nn.Linear(192, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class LogisticRegression(nn.Module):
    """Multinomial logistic regression: softmax(W x + b) on the flattened normalised pixels (30,730 parameters
    for 3x32x32 inputs and 10 classes). Zero-initialised, the usual start of a convex problem: every seed starts
    from the same model, and the cross-entropy objective (plus weight decay) is convex in (W, b)."""

    def __init__(self, num_classes: int = 10, num_features: int = 3 * 32 * 32) -> None:
        super().__init__()
        self.linear = nn.Linear(num_features, num_classes)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(x, 1))


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(GN_GROUPS, channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with GroupNorm; option-A shortcut (stride-2 subsampling + zero channel padding)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.gn1 = _norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.gn2 = _norm(planes)
        self.pad = planes - in_planes if stride != 1 or in_planes != planes else 0

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        if not self.pad:
            return x
        half = self.pad // 2
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, half, self.pad - half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet-(6n+2): 3x3 conv 16, three stages of n blocks (16, 32, 64 channels), global pool, FC."""

    def __init__(self, num_blocks: tuple[int, int, int] = (3, 3, 3), num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.gn1 = _norm(16)
        layers, in_planes = [], 16
        for planes, blocks, stride in zip((16, 32, 64), num_blocks, (1, 2, 2)):
            stage = []
            for s in [stride] + [1] * (blocks - 1):
                stage.append(BasicBlock(in_planes, planes, s))
                in_planes = planes
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3 = layers
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():  # Kaiming init of conv and linear weights, as in Idelbayev's resnet.py
            if isinstance(m, nn.Linear | nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.linear(out)


def resnet20(num_classes: int = 10) -> ResNet:
    """ResNet-20 (n = 3): 269,722 parameters at 10 classes."""
    return ResNet((3, 3, 3), num_classes)


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """``"cnn"`` (LeNet-like CNN of Hsu et al. 2019), ``"resnet20"`` (GroupNorm ResNet-20) or ``"logreg"``."""
    if name == "cnn":
        return LeNetCNN(num_classes)
    if name == "logreg":
        return LogisticRegression(num_classes)
    if name == "resnet20":
        return resnet20(num_classes)
    if name in TASK_MODELS:  # paper 2's task models (client/task_models.py)
        return build_task_model(name, num_classes)
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS + TASK_MODELS}")


def num_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
