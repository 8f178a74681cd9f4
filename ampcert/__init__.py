"""ampcert: benchmark and certify automatic mixed precision training.

The AMP engine lives in :mod:`ampcert.amp` and is usable on its own; the
harness (spec -> runner -> results -> report) is driven by the ``ampcert`` CLI.
"""

from ampcert.version import __version__

__all__ = ["__version__"]
