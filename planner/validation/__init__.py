"""The simulator against the live engine, a running server, or a recorded run."""
