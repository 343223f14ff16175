"""A fleet: N engine replicas on Ray Serve behind one OpenAI endpoint (`batchproof fleet`).

The replicas are a Ray Serve deployment (Ray places them, restarts them and routes to them);
the ingress is the server package's own app, running requests through a router to the
replicas instead of a local engine. Only this package imports ray (an optional extra)."""
