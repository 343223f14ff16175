"""What the engine keeps of computed keys and values: one KV region per batch slot (kv_cache.py),
the prefix cache of whole blocks (prefix_cache.py), and the reuse around a prefill and a slot's
release (prefix_reuse.py)."""
