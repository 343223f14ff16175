"""The OpenAI-compatible HTTP server, by endpoint as vLLM's entrypoints: one package per
endpoint (`chat/`, `completions/`, `responses/`, `trainer/`: load_weights, the control plane and
the notary; the small routes in `admin.py`), and what they share in rooms: `guards/` (keys,
limits, hosts), `request/` (shared request models, sampling fields, planning, structured output),
`reply/` (formatters' framing, entries, weight versions, large bodies), `tools/` (tool calls);
at the top the app, its state and settings, serving, errors, metrics and info.

It talks to the engine through `EngineClient`, `Backend` and `WeightControl` (engine_client.py),
never the other way.
"""
