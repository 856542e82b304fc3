# A vLLM OpenAI server on GPUs (vLLM's own image) with rag-stream installed for its KV connector.
# The build context is a folder holding the rag-stream wheel (pip wheel --no-deps -w DIR .).
#   docker build -f deploy/vllm-gpu.Dockerfile -t rag-stream-vllm DIR
FROM docker.io/vllm/vllm-openai:v0.32.0
COPY rag_stream-*.whl /wheels/
RUN pip install --no-cache-dir --no-deps /wheels/rag_stream-*.whl \
 && pip install --no-cache-dir "redis[hiredis]>=5.0" "pydantic-settings[yaml]>=2.4"
