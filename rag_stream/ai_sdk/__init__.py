"""The Vercel AI SDK's UI message stream: what ``useChat`` speaks (routes.py)."""
