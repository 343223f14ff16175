"""What the engine keeps of computed keys and values: one KV region per batch slot (kv_cache.py),
the prefix cache of whole blocks (prefix_cache.py), and their one owner (manager.py): the slots
taken and given back, the reuse around a prefill."""
