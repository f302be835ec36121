"""The two-stage pipeline behind `bin/distill`."""
