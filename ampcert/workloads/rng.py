"""Every random number of a run, from numpy, named by what it is for.

A run's randomness is its seed plus a *purpose*: the starting value of each
parameter (``"init"``, keyed by the parameter's name), the order of the
training batches (``"batches"``), the augmentation of step k's batch
(``"augment"``, keyed by k). Each (seed, purpose, keys) gets a generator of
its own, ``numpy.random.Generator(PCG64)`` seeded through a
``SeedSequence``, so

- the torch and the JAX backend, which both draw from here, see the same
  initial weights, the same batches in the same order and the same
  augmentation for a seed: a cross-framework comparison compares like with
  like;
- a stream does not depend on how much another one was used: adding a layer
  does not change the other layers' starting values, and a workload that
  augments does not move the batch order;
- nothing reads or advances a global generator (numpy's, python's, torch's),
  so a user's code cannot shift a run's numbers by drawing a random number.

Why numpy and not a framework's generator: it is the one library both
backends have. Its streams are the same on every platform; numpy keeps
``Generator`` streams stable between releases in practice but does not
promise it, which is why plan.json's environment fingerprint records the
numpy version with every suite.
"""

from __future__ import annotations

import hashlib

import numpy as np

# SeedSequence takes non-negative integers: a suite's seed may be any int.
_SEED_RANGE = 2**64


def _word(key: int | str) -> int:
    """A non-negative integer for a SeedSequence spawn key: small non-negative
    ints (steps) as they are, anything else by a stable hash (not Python's
    ``hash``, which changes between processes)."""
    if isinstance(key, int) and key >= 0:
        return key
    return int.from_bytes(hashlib.sha256(str(key).encode()).digest()[:8], "little")


def stream(seed: int, purpose: str, *keys: int | str) -> np.random.Generator:
    """The generator for one purpose of a run: the same (seed, purpose, keys)
    always gives the same numbers, and different ones independent numbers."""
    sequence = np.random.SeedSequence(seed % _SEED_RANGE, spawn_key=(_word(purpose), *map(_word, keys)))
    return np.random.Generator(np.random.PCG64(sequence))
