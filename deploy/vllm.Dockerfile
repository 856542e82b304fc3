# A vLLM OpenAI server with the rag-stream KV connector importable (--kv-transfer-config).
FROM vllm/vllm-openai:v0.32.0
COPY pyproject.toml README.md /opt/rag-stream/
COPY rag_stream /opt/rag-stream/rag_stream
RUN pip install --no-deps /opt/rag-stream && pip install "redis[hiredis]>=5.0" "pydantic-settings[yaml]>=2.4"
