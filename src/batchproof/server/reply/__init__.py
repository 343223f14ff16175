"""From engine outputs to a reply, what the endpoints' formatters share: the formatter protocol
and the chat family's stream framing (formatter.py), a request's choices as one stream
(merge.py), logprob entries, token ids and usage in OpenAI's shapes (entries.py), the weight
versions a choice carries (weight_versions.py), and large replies encoded off the event loop
(json_body.py)."""
