"""Tests of batchproof.common."""
