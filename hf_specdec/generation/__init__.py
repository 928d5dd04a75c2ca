"""The speculative decoding loop, in the order it runs: validate, set up, step, emit, finish."""
