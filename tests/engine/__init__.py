"""Tests of batchproof.engine."""
