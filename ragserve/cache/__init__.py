"""The retrieval cache: in-process LRU or Redis, keyed by query, parameters, index version and models."""
