"""A run's recipe, its pipeline (plan, cost model, simulate, analyse), seeds, SLOs and sweeps."""
