"""fedmomentum client package: CIFAR-10 data (``data``, ``partition``, ``augment``), models (``models``),
local training around ``strategies.math`` (``train``), and the Flower ClientApp ``client.app:app``."""
