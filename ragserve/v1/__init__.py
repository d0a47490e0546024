"""Generated gRPC stubs for ragserve.v1 (see protos/generate.py); do not edit."""
