"""Running the matrix: one worker process per run, supervised by the orchestrator."""
