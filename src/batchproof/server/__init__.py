"""The OpenAI-compatible HTTP server, by endpoint as vLLM's entrypoints: one package per
endpoint (`chat/`, `completions/`, `responses/`; the small routes in `admin.py`), and at the
top what they share (the app, request models and sampling fields, planning and serving, entries,
errors, auth, limits, tools, structured output).

It talks to the engine through `EngineClient` and `Backend` (engine_client.py), never the other way.
"""
