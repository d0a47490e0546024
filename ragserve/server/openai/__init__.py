"""The OpenAI-compatible door: its routes (door.py) and its wire (wire.py), on the HTTP base
(server/http/)."""
