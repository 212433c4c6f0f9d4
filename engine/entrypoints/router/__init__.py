"""The live fleet: K replica servers on loopback behind a routing proxy (`planner serve --replicas K`)."""
