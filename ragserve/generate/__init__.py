"""Answer generation: the Protocol and the vLLM engine."""
