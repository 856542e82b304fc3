"""Embedder, vector store and retriever."""
