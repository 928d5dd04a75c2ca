"""Distilling drafters for a target: `python -m training.distill` (or `accelerate launch -m training.distill`)."""
