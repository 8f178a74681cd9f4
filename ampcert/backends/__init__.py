"""Training loops, one per framework."""
