"""KV caches that rows of a batch advance through at their own speed (`ragged`), and the target's hidden states a
feature drafter reads (`hidden`)."""
