"""The trainer's entry script: `accelerate launch training/distill.py` or `python -m training.distill` (its library half is
`hf_specdec.training`)."""
