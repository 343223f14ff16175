"""Sampling, pure functions over one step's logits: what a request asks for (params.py, the
constraint that travels in it: constraint.py), how a token is chosen from a row (sampler.py),
and the exact logprobs recorded for it (logprobs.py)."""
