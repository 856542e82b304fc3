"""rag-stream: resumable streaming RAG on vLLM, Qdrant and Redis."""

__version__ = "0.1.0"
