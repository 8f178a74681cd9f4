"""Initial weights without a framework: numpy arrays keyed by torch's names.

Each built-in workload has one function, ``initial_weights`` in its module,
that returns the starting value of every parameter (and of every BatchNorm
running statistic) as :class:`Weights`, keyed by the name the torch model
gives it (``stages.0.conv1.weight``). The torch model copies them in
(:func:`ampcert.workloads.torch_models.load_weights`, which refuses a
missing, extra or misshapen name), the JAX model trains them as they are. So
a torch run and a JAX run of one seed start from bit-identical weights, and
neither framework's generator is involved: JAX-only installs build them too.

The distributions are the ones the torch modules would use, so training
behaves as it did when torch drew the weights:

``default_weight``
    torch's default for ``nn.Linear`` and ``nn.Conv2d``: ``kaiming_uniform_``
    with ``a = sqrt(5)``, which is U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    fan_in = input features x kernel area.
``default_bias``
    their bias default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
``kaiming_normal``
    ``kaiming_normal_(mode="fan_out", nonlinearity="relu")``: N(0, 2/fan_out),
    fan_out = output channels x kernel area (He et al. 2015; ResNet convs).
``normal``
    N(0, std^2), e.g. GPT-2's 0.02.
``ones`` / ``zeros``
    norm gains and shifts, biases that start at zero, running statistics.

Each tensor comes from its own stream, ``rng.stream(seed, "init", name)``
(see :mod:`ampcert.workloads.rng`): its values depend on the seed, its name
and its shape only, not on the order in which layers are declared. Values are
drawn in float64 and rounded once to float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ampcert.workloads import rng

# kaiming_uniform_'s gain for leaky_relu with a = sqrt(5), as nn.Linear and
# nn.Conv2d use it: sqrt(2 / (1 + 5)). Its bound, gain * sqrt(3 / fan_in), is 1/sqrt(fan_in).
_DEFAULT_GAIN = math.sqrt(2.0 / (1.0 + 5.0))


@dataclass
class Weights:
    """A model's starting point: trained parameters and untrained buffers
    (BatchNorm running statistics), float32 numpy arrays keyed by torch name."""

    params: dict[str, np.ndarray] = field(default_factory=dict)
    buffers: dict[str, np.ndarray] = field(default_factory=dict)

    def count(self) -> int:
        """Number of trained values (what torch's ``sum(p.numel())`` reports)."""
        return int(sum(a.size for a in self.params.values()))


class Initialiser:
    """Draws one seed's starting values, tensor by tensor, into :attr:`weights`.

    The layer helpers (:meth:`linear`, :meth:`conv`, :meth:`batch_norm`,
    :meth:`layer_norm`) name their tensors as the torch module does
    (``<prefix>.weight``, ``<prefix>.bias``, ``<prefix>.running_mean``)."""

    def __init__(self, seed: int):
        self.seed = seed
        self.weights = Weights()

    # -- one tensor ------------------------------------------------------------

    def _param(self, name: str, value: np.ndarray) -> None:
        if name in self.weights.params:
            raise ValueError(f"parameter {name!r} initialised twice")
        self.weights.params[name] = np.ascontiguousarray(value, dtype=np.float32)

    def uniform(self, name: str, shape: tuple[int, ...], bound: float) -> None:
        self._param(name, rng.stream(self.seed, "init", name).uniform(-bound, bound, shape))

    def normal(self, name: str, shape: tuple[int, ...], std: float) -> None:
        self._param(name, rng.stream(self.seed, "init", name).normal(0.0, std, shape))

    def default_weight(self, name: str, shape: tuple[int, ...]) -> None:
        fan_in = math.prod(shape[1:])
        self.uniform(name, shape, _DEFAULT_GAIN * math.sqrt(3.0 / fan_in))

    def default_bias(self, name: str, size: int, fan_in: int) -> None:
        self.uniform(name, (size,), 1.0 / math.sqrt(fan_in))

    def kaiming_normal(self, name: str, shape: tuple[int, ...]) -> None:
        fan_out = shape[0] * math.prod(shape[2:])
        self.normal(name, shape, math.sqrt(2.0) / math.sqrt(fan_out))

    def constant(self, name: str, shape: tuple[int, ...], value: float) -> None:
        self._param(name, np.full(shape, value))

    def buffer(self, name: str, value: np.ndarray) -> None:
        self.weights.buffers[name] = np.ascontiguousarray(value, dtype=np.float32)

    # -- layers, named as torch names them ----------------------------------------

    def linear(self, prefix: str, fan_in: int, fan_out: int, bias: bool = True) -> None:
        """``nn.Linear(fan_in, fan_out)`` with torch's default initialisation."""
        self.default_weight(f"{prefix}.weight", (fan_out, fan_in))
        if bias:
            self.default_bias(f"{prefix}.bias", fan_out, fan_in)

    def conv(self, prefix: str, cin: int, cout: int, kernel: int, bias: bool = True,
             he_fan_out: bool = False) -> None:
        """``nn.Conv2d(cin, cout, kernel)``: torch's default, or with
        ``he_fan_out`` the ResNet convention (kaiming_normal, fan_out, relu)."""
        shape = (cout, cin, kernel, kernel)
        if he_fan_out:
            self.kaiming_normal(f"{prefix}.weight", shape)
        else:
            self.default_weight(f"{prefix}.weight", shape)
        if bias:
            self.default_bias(f"{prefix}.bias", cout, cin * kernel * kernel)

    def batch_norm(self, prefix: str, channels: int, gain: float = 1.0) -> None:
        """``nn.BatchNorm2d``: gain (1, or 0 for a block that starts as the
        identity), shift 0, running mean 0 and running variance 1."""
        self.constant(f"{prefix}.weight", (channels,), gain)
        self.constant(f"{prefix}.bias", (channels,), 0.0)
        self.buffer(f"{prefix}.running_mean", np.zeros(channels))
        self.buffer(f"{prefix}.running_var", np.ones(channels))

    def layer_norm(self, prefix: str, size: int) -> None:
        self.constant(f"{prefix}.weight", (size,), 1.0)
        self.constant(f"{prefix}.bias", (size,), 0.0)
