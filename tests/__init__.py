"""batchproof's tests; their folders mirror the package."""
