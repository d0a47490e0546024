"""The HTTP base every HTTP door stands on: the listener (server/http/listener.py: connections,
TLS, the cap and the deadlines), the one error table (errors.py), what a request's head and body
must pass (host.py, body.py) and the one app built from every HTTP door's routes (app.py)."""
