# ws-tune GPU worker: compiles (tilelang + nvcc) and times (torch CUDA) candidates.
#   docker build -f docker/worker.Dockerfile -t ws-tune-worker .
#   docker run --gpus '"device=0"' -e WS_TUNE_DB=postgresql+psycopg://... ws-tune-worker --gpu 0
# One container per GPU. Uploaded kernel sources run here (in the builder's and
# the runner's own processes): give the container no credentials beyond the DB URL.
FROM nvidia/cuda:12.8.1-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip python3-dev build-essential git \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 wstune
WORKDIR /opt/ws-tune

COPY pyproject.toml constraints.txt README.md ./
COPY ws_tuner ./ws_tuner
COPY server ./server
COPY migrations ./migrations
# torch's CUDA build first (constraints.txt pins its version), then the tested set.
RUN pip install --index-url https://download.pytorch.org/whl/cu128 "torch==2.13.0" \
 && pip install -c constraints.txt .

USER wstune
ENV WS_TUNE_KERNEL_CACHE_DIR=/home/wstune/.cache/ws-tune/kernels
# SIGTERM drains: the candidate in flight finishes (WS_TUNE_DRAIN_TIMEOUT) or is handed back.
STOPSIGNAL SIGTERM
ENTRYPOINT ["ws-tune", "worker"]
CMD ["--gpu", "0"]
