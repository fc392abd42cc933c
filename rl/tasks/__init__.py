"""Tasks: the file format, importers, validation and deduplication, and the pool."""
