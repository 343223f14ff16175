"""The parity probe: measures any OpenAI-compatible server's batch parity and writes a
witness. Imports only `batchproof.common` of ours (no torch, no numpy), so it starts at
once on a machine without them."""
