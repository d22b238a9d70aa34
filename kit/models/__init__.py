"""Models: the embedded starter, resolving ids and paths, reading model metadata."""
