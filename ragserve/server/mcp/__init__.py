"""The MCP door: its route and tools (door.py) and their results (results.py), on the HTTP base
(server/http/)."""
