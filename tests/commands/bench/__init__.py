"""Tests of `batchproof bench`: its figures and the files they write, without a server."""
