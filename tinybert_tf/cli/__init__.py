"""The command line every tool shares: exit codes, error handling, flagfiles."""
