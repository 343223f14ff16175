"""POST /v1/completions, the legacy shape: its request (protocol.py), its route (route.py), its
plan (plan.py: every prompt shape to token ids, echo and prompt scoring) and its formatter
(formatter.py)."""
