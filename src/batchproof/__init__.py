"""batchproof: exact logprobs, batch-invariant decode, and the tools that check both."""

__version__ = "0.1.0"
