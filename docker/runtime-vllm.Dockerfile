# syntax=docker/dockerfile:1
# The runtime image for LLMs: vLLM's own image (its CUDA, PyTorch and vLLM build, the version
# pinned in pyproject's `vllm` extra) with zeroserve's data plane on top, as a non-root user.
# vLLM's engine core starts by spawn (VLLM_WORKER_MULTIPROC_METHOD): a forked child inherits
# the data plane's CUDA state and fails to initialise CUDA.
#
#   docker build -f docker/runtime-vllm.Dockerfile -t zeroserve-runtime-vllm:0.1.0 .
#
# Bases are pinned by tag and digest; see docker/README.md.

# ---- build: zeroserve's wheel only (pure Python; vLLM and PyTorch come from the base) ----
FROM vllm/vllm-openai:v0.11.0@sha256:014a95f21c9edf6abe0aea6b07353f96baa4ec291c427bb1176dc7c93a85845c AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY zeroserve ./zeroserve
COPY foundation ./foundation
COPY data_plane ./data_plane
COPY runtimes ./runtimes
COPY control_plane ./control_plane
COPY activator ./activator
RUN python3 -m pip wheel --no-deps --wheel-dir /wheels .

# ---- final: the vLLM image, our wheel and its (wheel-only) dependencies, a non-root user ----
FROM vllm/vllm-openai:v0.11.0@sha256:014a95f21c9edf6abe0aea6b07353f96baa4ec291c427bb1176dc7c93a85845c
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/home/zeroserve \
    VLLM_WORKER_MULTIPROC_METHOD=spawn
COPY --from=build /wheels /tmp/wheels
COPY docker/vllm_constraints.py /tmp/vllm_constraints.py
# zeroserve and its dependencies go in under vLLM's constraints (vllm_constraints.py: vLLM's
# declared ranges, vLLM and PyTorch pinned as installed), so pip cannot silently move a
# package vLLM needs (protobuf, transformers, torch) out of what vLLM accepts: it fails to
# resolve instead. pip check then fails the build on any other broken requirement.
# --only-binary: a dependency that would need compiling fails the build instead of pulling
# a compiler in.
RUN python3 /tmp/vllm_constraints.py vllm torch > /tmp/vllm-constraints.txt \
    && python3 -m pip install --only-binary=:all: --constraint /tmp/vllm-constraints.txt \
       /tmp/wheels/*.whl \
    && python3 -m pip check \
    && rm -rf /tmp/wheels /tmp/vllm_constraints.py /tmp/vllm-constraints.txt
RUN groupadd --system --gid 10001 zeroserve \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/zeroserve --create-home \
       --shell /usr/sbin/nologin zeroserve \
    && mkdir -p /srv/zeroserve/repository /var/cache/zeroserve \
    && chown 10001:10001 /srv/zeroserve/repository /var/cache/zeroserve
USER 10001:10001
WORKDIR /home/zeroserve
EXPOSE 8080
# The base image's entrypoint is `vllm serve`; ours is the data plane, which runs vLLM's
# engine in-process for LLM models (runtimes/).
ENTRYPOINT ["zeroserve"]
CMD ["serve", "--model-repository", "/srv/zeroserve/repository", "--model-control-mode", "explicit", "--host", "0.0.0.0", "--http-port", "8080", "--cache-dir", "/var/cache/zeroserve"]
