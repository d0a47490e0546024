"""Offline indexer: load -> chunk -> embed -> index -> verify -> publish."""
