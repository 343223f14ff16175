"""The Responses API (POST /v1/responses): its request (protocol.py), its route, its translation
onto a chat request that chat's plan then plans, the formatter of its deltas as OpenAI's
response objects and semantic events, and the store previous_response_id reads
(store.py), which this endpoint alone holds (route.py's keep_responses puts it in app.state)."""
