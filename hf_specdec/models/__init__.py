"""Drafter models: `PreTrainedModel`s with a `PretrainedConfig` each (saved and loaded as transformers does)."""
