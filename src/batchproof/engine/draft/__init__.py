"""A sequence's own drafter for speculative decoding, below `Sequence`: drafts looked up in its
own tokens (lookup.py), their number set by its measured acceptance and the step-cost model
(drafter.py, cost.py). The step's propose and verify, above the outputs, are in speculative/."""
