"""`python -m hf_specdec.cli` is the `hf-specdec` command."""

from . import main

raise SystemExit(main())
