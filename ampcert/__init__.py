"""ampcert: benchmark and certify automatic mixed precision training.

The AMP engine lives in :mod:`ampcert.amp` and is usable on its own; the
harness (spec -> runner -> results -> report) is driven by the ``ampcert`` CLI.
"""

__version__ = "0.1.0"
