"""The parity board: many servers, each configuration probed twice and checked, with negative controls."""
