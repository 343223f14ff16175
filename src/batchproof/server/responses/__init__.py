"""The Responses API (POST /v1/responses): a translation onto the chat route's plan and a
formatter of its deltas as OpenAI's response objects and semantic events."""
