"""A team's own training job (a suite entry's ``command:``): ampcert does not train it, it
runs it once per cell of the matrix, tells it what to run, samples telemetry around it
and reads the MLLOG it writes into the run's result ([own-job.md](../../docs/own-job.md)).

One concept, three layers, one module each (this package imports none of them):

- :mod:`.entry` (the spec layer): the entry as a suite names it, :class:`~.entry.OwnJob`,
  its template fields and their rendering;
- :mod:`.run` (the runner layer): running it, :class:`~.run.OwnJobRun` (its own session,
  telemetry around its process tree, ending the tree), a running run of the local
  executor, so every executor runs it; :mod:`.keeper`, the script its processes run
  under (the child subreaper that ends every process the job starts);
- :mod:`.result` (the training layer): its MLLOG read into the run's result.
"""
