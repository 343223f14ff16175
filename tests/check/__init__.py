"""Tests of batchproof.check."""
