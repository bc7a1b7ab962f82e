"""Sweep configs for txf-sweep: a base run config, a grid, settings."""
