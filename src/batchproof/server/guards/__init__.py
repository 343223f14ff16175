"""What guards the server before and around a request's work: API keys and the admin's role
(auth.py), who sent each request in flight (owners.py), the Host check without a key
(host_check.py), the JSON content type (content_type.py), a body's size and deadline
(body_limit.py), connections and requests in flight (connections.py), and a body's JSON counted
before it is parsed (precount.py). None imports an endpoint, the app or the state."""
