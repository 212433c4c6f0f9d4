"""Front ends of the engine."""
