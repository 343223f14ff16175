"""Receipts (docs/receipts.md): one reply's inputs and outputs as a small JSON object, and the
verdict of re-executing it. Plain data here (no torch): the server builds receipts with these
functions and `batchproof verify-receipt` compares what it re-executed with the same ones."""
