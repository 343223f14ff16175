"""The witness report: one self-contained HTML page (inline CSS and SVG, no script, no
network). Imports only `batchproof.common` and `batchproof.check` of ours (no torch, no numpy)."""
