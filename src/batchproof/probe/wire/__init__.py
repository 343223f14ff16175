"""What speaks to a server: the request per route, one stream fired and read, the fields a
server may refuse, what it says about itself, and m_formed from its log, /metrics and /slots.
Imports `records/` of the probe, never `judge/`."""
