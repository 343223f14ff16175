"""Speculative decoding that changes no bit: drafts looked up in the sequence's own tokens
(lookup.py), their number set per sequence by its measured acceptance (drafter.py), verified as
extra rows of one decode step and kept token by token as plain decoding would choose them
(verify.py). docs/speculative.md says why every emitted bit is the one plain decoding gives."""
