"""Running the matrix: planning, the folder lock, signals, and one driver (fleet.run_fleet) for every executor."""
