"""The code of the `bin/` tools besides `bin/distill`: importable, on top of the package."""
