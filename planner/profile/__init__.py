"""`planner profile`: time the real engine's pieces on a device and fit a step-time model.

Kept import-light: the torch-heavy modules (run, pieces, device, build) are
imported by the CLI command only when a profile actually runs.
"""
