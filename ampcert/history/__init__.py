"""The nightly history: every results folder's metrics and verdicts, kept as series.

- :mod:`~ampcert.history.records`: a results folder as one *night* (its
  identity, machine, fingerprint, certificate) and its points: per subject
  (workload entry, backend, AMP, precision) and metric, the median over seeds
  and the per-seed values;
- :mod:`~ampcert.history.store`: where nights are kept: an SQLite file
  (default) or a PostgreSQL database (a team's shared store), by URL, with a
  versioned schema;
- :mod:`~ampcert.history.changepoints`: change points in one metric's series
  (ruptures' PELT), and whether the newest nights regressed.

Its modules import each other directly, never through this file.
"""
