"""The shape check: judges a witness against a contract. Imports only `batchproof.common`
of ours (no torch, no numpy)."""
