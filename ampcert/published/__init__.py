"""Published MLPerf Training results: what a round's submission folders say, scored as MLPerf
scores them, and what MLPerf's score leaves out.

- :mod:`.scores`: one benchmark folder of one system (``result_*.txt``, ``scaling.json``):
  MLPerf's official time-to-train reproduced to the last digit (the result summarizer's
  olympic mean times the scaling factor), the spread across runs, a bootstrap interval,
  whether the runs stopped on discrete evaluation steps, and accelerator-hours per run.
"""
