"""Request pipelines: turn a validated request into a sequence of typed events."""
