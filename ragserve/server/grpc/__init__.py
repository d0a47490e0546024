"""The gRPC door: the servicer (servicer.py), its one error table (status.py), its interceptors
(auth.py, handlers.py) and its TLS that follows rotation (tls.py)."""
