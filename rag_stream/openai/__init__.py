"""OpenAI's Chat Completions and Models endpoints: a wire over the ``generate`` and ``answer``
kinds (routes.py), above both. How their events are rendered as chunks is
``rag_stream/api/chat_format.py``, which the resume route shares."""
