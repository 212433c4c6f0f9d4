"""What a run means: the steady state, the verdict in plain words."""
