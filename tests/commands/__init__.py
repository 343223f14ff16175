"""Tests of the CLI verbs, end to end."""
