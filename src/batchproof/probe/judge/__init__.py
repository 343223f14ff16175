"""What judges the answers, as pure functions over records: agreement and verdicts, logprob
parity, the m=1 references, mixed and fleet bands, the fleet's agreement, fail-open,
`--cache` and `--stream-parity`. Imports `records/` of the probe, never `wire/`."""
