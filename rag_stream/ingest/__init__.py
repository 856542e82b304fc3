"""Ingestion: parsing uploads into text, chunking, and writing chunks to SQL and Qdrant."""
