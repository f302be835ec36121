"""Training mechanics: the step loop, phases, recipes, input, caches, distribution."""
