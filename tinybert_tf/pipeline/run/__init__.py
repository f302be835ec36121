"""The run folder: its state, lock, context and report."""
