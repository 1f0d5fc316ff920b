# syntax=docker/dockerfile:1
# The platform image: control plane and activator, one image, two commands
# (`zeroserve control-plane`, `zeroserve activator`; see deploy/kubernetes/).
#
#   docker build -f docker/platform.Dockerfile -t zeroserve-platform:0.1.0 .
#
# Bases are pinned by tag and digest; see docker/README.md for where the digests come from
# and how to check them before a release.

# ---- build: a virtual environment with zeroserve and the Kubernetes client ----
FROM python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84 AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/zeroserve
WORKDIR /src
COPY pyproject.toml README.md ./
COPY zeroserve ./zeroserve
COPY foundation ./foundation
COPY data_plane ./data_plane
COPY runtimes ./runtimes
COPY control_plane ./control_plane
COPY activator ./activator
# Every dependency ships wheels for this platform: nothing is compiled, so no compiler here.
RUN /opt/zeroserve/bin/pip install ".[k8s]"

# ---- final: the same Python, the environment, a non-root user ----
FROM python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84
ENV PATH=/opt/zeroserve/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 10001 zeroserve \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/zeroserve --create-home \
       --shell /usr/sbin/nologin zeroserve
COPY --from=build /opt/zeroserve /opt/zeroserve
USER 10001:10001
WORKDIR /home/zeroserve
# 8080: the activator's public port; 8081: the control plane's admin API.
EXPOSE 8080 8081
ENTRYPOINT ["zeroserve"]
CMD ["control-plane"]
