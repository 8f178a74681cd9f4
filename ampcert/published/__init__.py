"""Published MLPerf Training results: what a round's submission folders say, scored as MLPerf
scores them, and what MLPerf's score leaves out (docs/published.md).

- :mod:`.scores`: one benchmark folder of one system (``result_*.txt``, ``scaling.json``):
  MLPerf's official time-to-train reproduced to the last digit (the result summarizer's
  olympic mean times the scaling factor), the spread across runs, a bootstrap interval,
  whether the runs stopped on discrete evaluation steps, and accelerator-hours per run.
- :mod:`.system`: a system description (``systems/<system>.json``) read as the environment
  fingerprint of its runs.
- :mod:`.importer`: a round, a submitter or a benchmark folder imported, one folder per
  (system, benchmark): ``published.json``, the logs byte for byte with their digests.
- :mod:`.energy`: energy to train from power logs: MLPerf's figure reproduced, nodes only, and
  nodes and measured switches; the measurement type and the sampling rate.
- :mod:`.plan`: N training runs on each imported system: wall time, accelerator-hours, energy, cost.
- :mod:`.compare`: systems compared for one benchmark, published and ampcert's measured runs alike.
"""
