# syntax=docker/dockerfile:1
# The runtime image for LLMs: vLLM's own image (its CUDA, PyTorch and vLLM build, the version
# pinned in pyproject's `vllm` extra) with zeroserve's data plane on top, as a non-root user.
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
    HOME=/home/zeroserve
COPY --from=build /wheels /tmp/wheels
# --only-binary: a dependency that would need compiling fails the build instead of pulling
# a compiler in; vLLM's own pins win where they overlap (pip keeps what satisfies both).
RUN python3 -m pip install --only-binary=:all: /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels
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
