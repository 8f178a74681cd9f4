"""Callbacks that make a training framework's own job report to ampcert.

- :mod:`ampcert.integrations.hf`: ``AmpcertCallback`` for HF Transformers'
  ``Trainer`` (``pip install 'ampcert[hf]'``);
- :mod:`ampcert.integrations.lightning`: ``AmpcertCallback`` and the
  ``AmpcertPrecision`` plugin for Lightning (``pip install 'ampcert[lightning]'``).

Each writes the MLLOG of an own job (``$AMPCERT_MLLOG``) through
:mod:`ampcert.track`, and measures the precision disclosure on the first
training step. This package imports neither framework; each module imports
its own.
"""
