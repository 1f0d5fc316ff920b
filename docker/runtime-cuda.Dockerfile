# syntax=docker/dockerfile:1
# The runtime image for ONNX Runtime and PyTorch models on NVIDIA GPUs (and CPUs): one
# `zeroserve serve` data plane per pod, in explicit model-control mode, as the knative
# backend starts it (control_plane/backends/knative/manifests.py).
#
#   docker build -f docker/runtime-cuda.Dockerfile -t zeroserve-runtime-cuda:0.1.0 .
#
# Bases are pinned by tag and digest; see docker/README.md.

# ---- build: a virtual environment with zeroserve, CUDA PyTorch and ONNX Runtime GPU ----
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04@sha256:ac55d124da4882b497f732d8dfd9a702d5447a5f29d08d56da6f64f0a1eb34bc AS build
# The versions CI tests the CPU builds of (.ci/run, pip list).
ARG TORCH_VERSION=2.13.0
ARG ONNXRUNTIME_GPU_VERSION=1.31.1
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/zeroserve
WORKDIR /src
COPY pyproject.toml README.md ./
COPY zeroserve ./zeroserve
COPY foundation ./foundation
COPY data_plane ./data_plane
COPY runtimes ./runtimes
COPY control_plane ./control_plane
COPY activator ./activator
# PyTorch from its CUDA 12.8 index. Our base dependencies name the CPU `onnxruntime`, which
# installs the same module as `onnxruntime-gpu`: remove it, then put the GPU build back whole.
RUN /opt/zeroserve/bin/pip install --extra-index-url https://download.pytorch.org/whl/cu128 \
        "torch==${TORCH_VERSION}" ".[torch,gpu]" \
    && /opt/zeroserve/bin/pip uninstall -y onnxruntime \
    && /opt/zeroserve/bin/pip install --force-reinstall --no-deps \
        "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}"

# ---- final: the CUDA runtime, Python (no headers, no compiler), the environment ----
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04@sha256:ac55d124da4882b497f732d8dfd9a702d5447a5f29d08d56da6f64f0a1eb34bc
ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/zeroserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/zeroserve
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 zeroserve \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/zeroserve --create-home \
       --shell /usr/sbin/nologin zeroserve \
    && mkdir -p /srv/zeroserve/repository /var/cache/zeroserve \
    && chown 10001:10001 /srv/zeroserve/repository /var/cache/zeroserve
COPY --from=build /opt/zeroserve /opt/zeroserve
USER 10001:10001
WORKDIR /home/zeroserve
EXPOSE 8080
ENTRYPOINT ["zeroserve"]
CMD ["serve", "--model-repository", "/srv/zeroserve/repository", "--model-control-mode", "explicit", "--host", "0.0.0.0", "--http-port", "8080", "--cache-dir", "/var/cache/zeroserve"]
