"""Structured output: a request's JSON schema, regex or grammar as a token mask per step
(llguidance, over our own tokenizer's exact token bytes). docs/structured-output.md says why
llguidance and what a mask does to the logprobs a reply carries."""
