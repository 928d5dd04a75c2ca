"""KV caches that rows of a batch advance through at their own speed (`ragged`), the target's hidden states a
feature drafter reads (`hidden`), and the keyword models take their cache by (`keyword`)."""
