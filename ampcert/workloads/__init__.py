"""Workloads: models with their data, loss and metric (see base.py)."""
