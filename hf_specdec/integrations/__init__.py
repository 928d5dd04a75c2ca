"""How hf_specdec plugs into transformers: `enable(model)` (generate() takes `assistant=`) and the `custom_generate/` entry point."""
