"""The trainer's library half: what `training/distill.py` (the run) and each kind's `hf_specdec/kinds/<kind>/training.py`
use to distil a drafter against its target as deployed. Nothing here loads torch on import of the package itself;
`arguments` parses a command line before torch loads."""
