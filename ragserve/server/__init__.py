"""The gRPC adapter: a thin layer over the pipeline, plus process wiring."""
