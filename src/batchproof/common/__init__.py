"""What the server, the probe and the check share; the standard library only (no torch, no numpy)."""
