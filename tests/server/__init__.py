"""Tests of batchproof.server."""
