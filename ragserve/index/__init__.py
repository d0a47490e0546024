"""Vector index and docstore: on-disk format, loading, search."""
