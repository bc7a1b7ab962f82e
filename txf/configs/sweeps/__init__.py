"""Sweep configs for experiments/sweep.py: a base run config, a grid, settings."""
