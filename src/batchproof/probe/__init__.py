"""The parity probe: measures any OpenAI-compatible server's batch parity and writes a
witness. Imports only `batchproof.common` of ours (no torch, no numpy), so it starts at
once on a machine without them.

Two rooms and what they share: `wire/` speaks to the server (requests, streams, discovery,
metrics scraping), `judge/` judges what came back (verdicts, parity, references, the fleet,
`--cache` and `--stream-parity`), and `records/` holds the records both read (a reply, its
logprob entries, its arrival times, a message). A judge imports no wire module and the wire
no judge (tests/probe/test_probe_rooms.py); the run at the top (`run.py`, `mode.py`,
`config.py`, `display.py`, `matrix.py`, `witness.py`) joins them."""
