"""What `assistant=` accepts: the grammar of assistant names (`grammar.py`), the drafters shipped for the default target
(`shipped.py`), and the resolver that turns any assistant into a drafter (`resolve.py`; `hf_specdec.get_assistant` and
`hf_specdec.as_drafter` are its)."""
