"""Tests of batchproof.probe."""
