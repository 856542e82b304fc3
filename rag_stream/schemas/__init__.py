"""Request/response models and the typed SSE events."""
