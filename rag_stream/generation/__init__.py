"""Engines, detokenization and prompt building."""
