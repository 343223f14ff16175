"""Speculative decoding that changes no bit, the step's half: each sequence's drafts gathered
(propose.py; the drafter itself is the sequence's, in draft/), verified as extra rows of one
decode step and kept token by token as plain decoding would choose them (verify.py).
docs/speculative.md says why every emitted bit is the one plain decoding gives."""
