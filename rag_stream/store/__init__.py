"""SQLAlchemy models, the database connection and repositories."""
