# syntax=docker/dockerfile:1
#
# tiletune images (BuildKit). Targets:
#   server       (default) the REST server; migrates its database, then serves on 8642.
#                Database from TILETUNE_DB_URL (unset: an SQLite file in /var/lib/tiletune).
#   worker-cpu   a worker that measures on the CPU; server from TILETUNE_SERVER. It builds the native
#                CPU kernels (-march=native) where it starts, into TILETUNE_NATIVE_DIR: mount a volume
#                there (/var/cache/tiletune) so a restart finds the build.
#   worker-cuda  a worker for NVIDIA GPU nodes (torch's CUDA build, several GB on purpose; run with
#                the NVIDIA container toolkit: `docker run --gpus all ...`).
#   worker-npu   a worker for Ascend NPU nodes, FROM the CANN base image (never built by the
#                project's own checks; see the stage).
#
#   docker build -t tiletune-server .
#   docker build --target worker-cpu -t tiletune-worker-cpu .
#
# Every Python package comes from a lock with hashes (requirements/*.lock, `make lock`), installed
# with --no-deps --require-hashes; the project itself is a wheel built here. The last step of each
# target is deploy/image-check.sh TARGET: the image holds what its processes need at run time, or
# the build fails. The build context is .dockerignore's allow-list: a file read here must be in it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Ascend's CANN base image (quay.io/ascend/cann, also docker.io/ascendai/cann): CANN 9.1.0 for the
# 910B with Python 3.11. The CANN version must be one the torch_npu release below supports and one
# the nodes' driver (Ascend HDK) supports: see torch_npu's version table before changing either.
ARG CANN_IMAGE=quay.io/ascend/cann:9.1.0-910b-ubuntu22.04-py3.11
# torch_npu X.Y.Z runs on torch X.Y.Z only: the torch of requirements/worker-cpu.lock (2.13.0).
ARG TORCH_NPU_VERSION=2.13.0

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# The project's wheel, built with the build backend from the lock (setuptools, hashed).
FROM base AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY package/ package/
COPY client/ client/
COPY kernels/ kernels/
COPY nn/ nn/
COPY tuner/ tuner/
COPY service/ service/
COPY migrations/ migrations/
RUN --mount=type=bind,source=requirements/server.lock,target=/tmp/server.lock \
    awk '/^setuptools==/ { keep = 1; print; next } keep && /^[[:space:]]+--hash=/ { print; next } { keep = 0 }' \
        /tmp/server.lock > /tmp/build.lock \
    && pip install --no-cache-dir --no-deps --require-hashes -r /tmp/build.lock \
    && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

# Everything runs from a venv in /opt/tiletune (the path the systemd units use), as user tiletune
# (uid 10001) whose home holds the default SQLite file; /var/cache/tiletune is the workers' cache
# (native kernels, Triton), owned by that user so a fresh named volume mounted there is too.
FROM base AS runtime
RUN groupadd --system --gid 10001 tiletune \
    && useradd --system --no-log-init --uid 10001 --gid tiletune --home-dir /var/lib/tiletune --create-home \
        --shell /usr/sbin/nologin tiletune \
    && install -d -o tiletune -g tiletune -m 0750 /var/cache/tiletune \
    && python -m venv /opt/tiletune
ENV VIRTUAL_ENV=/opt/tiletune \
    PATH=/opt/tiletune/bin:$PATH
COPY --chmod=0755 deploy/image-check.sh /usr/local/bin/tiletune-image-check
WORKDIR /var/lib/tiletune

FROM runtime AS worker-cpu
# g++ (and libc headers) for the native CPU kernels, built where the worker starts; ninja is in the lock.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# torch==2.13.0+cpu from PyTorch's CPU index; every other package from PyPI; all hashed.
RUN --mount=type=bind,source=requirements/worker-cpu.lock,target=/tmp/worker.lock \
    pip install --no-cache-dir --no-deps --require-hashes \
        --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/worker.lock
# The native build runs once here, into a folder deleted afterwards, to prove the toolchain; the
# worker builds again at its start for the CPU it runs on.
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && pip check \
    && TILETUNE_NATIVE_DIR=/tmp/native-check tiletune-image-check worker-cpu \
    && rm -rf /tmp/native-check
ENV TILETUNE_NATIVE_DIR=/var/cache/tiletune/native
USER 10001:10001
# SIGTERM (docker stop) finishes the current trial and gives the lease back: allow it time,
# e.g. `docker stop -t 120`, compose's stop_grace_period, Kubernetes' terminationGracePeriodSeconds.
CMD ["tiletune", "worker", "--backend", "cpu"]

# PyPI's Linux x86_64 torch wheel is the CUDA build (CUDA libraries come as pip wheels); the driver
# comes from the host through the NVIDIA container toolkit. Triton compiles its launcher (C, against
# Python.h) on the node at run time: gcc and the libc headers are here, Python.h comes with the
# python image (/usr/local/include/python3.11); tiletune-image-check compiles one the same way.
FROM runtime AS worker-cuda
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN --mount=type=bind,source=requirements/worker-cuda.lock,target=/tmp/worker.lock \
    pip install --no-cache-dir --no-deps --require-hashes -r /tmp/worker.lock
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && pip check \
    && tiletune-image-check worker-cuda
ENV TRITON_CACHE_DIR=/var/cache/tiletune/triton
USER 10001:10001
CMD ["tiletune", "worker", "--backend", "cuda"]

# The Ascend NPU worker. NEVER BUILT by the project's checks (no CANN image or Ascend node where
# they run): build it on an Ascend host and run tiletune-image-check there. What must match:
# - torch (2.13.0, the CPU build of requirements/worker-cpu.lock: torch_npu runs on torch's CPU
#   build) and torch_npu (TORCH_NPU_VERSION: the release for that torch);
# - torch_npu and the CANN of CANN_IMAGE (torch_npu's version table), and CANN and the nodes'
#   driver (Ascend HDK);
# - the platform: requirements/worker-cpu.lock holds the x86_64 torch wheel; aarch64 Ascend hosts
#   (Kunpeng) need a lock made for aarch64.
# torch_npu and PyYAML are pinned but not hashed (no lock holds them yet).
# The CANN image keeps its environment (what set_env.sh exports) in ENV, and its Python packages
# (CANN's operator compiler needs them) in its interpreter: the venv sees them
# (--system-site-packages). The driver is the node's: Ascend Device Plugin / Docker Runtime
# mount it (deploy/kubernetes/worker-npu.yaml).
FROM ${CANN_IMAGE} AS worker-npu
ARG TORCH_NPU_VERSION
ARG NPU_PYTHON=/usr/local/python3.11/bin/python3
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
USER 0:0
RUN groupadd --system --gid 10001 tiletune \
    && useradd --system --no-log-init --uid 10001 --gid tiletune --home-dir /var/lib/tiletune --create-home \
        --shell /usr/sbin/nologin tiletune \
    && install -d -o tiletune -g tiletune -m 0750 /var/cache/tiletune \
    && "${NPU_PYTHON}" -m venv --system-site-packages /opt/tiletune
ENV VIRTUAL_ENV=/opt/tiletune \
    PATH=/opt/tiletune/bin:$PATH \
    HOME=/var/lib/tiletune
COPY --chmod=0755 deploy/image-check.sh /usr/local/bin/tiletune-image-check
WORKDIR /var/lib/tiletune
RUN --mount=type=bind,source=requirements/worker-cpu.lock,target=/tmp/worker.lock \
    pip install --no-cache-dir --no-deps --require-hashes \
        --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/worker.lock \
    && pip install --no-cache-dir --no-deps "torch_npu==${TORCH_NPU_VERSION}" "pyyaml==6.0.2"
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && tiletune-image-check worker-npu
USER 10001:10001
CMD ["tiletune", "worker", "--backend", "npu"]

# Last stage, so the default target. The server plans with the kernels' declarations, which are
# torch-free: its image holds no torch (tiletune-image-check fails the build if one slipped in).
FROM runtime AS server
RUN --mount=type=bind,source=requirements/server.lock,target=/tmp/server.lock \
    pip install --no-cache-dir --no-deps --require-hashes -r /tmp/server.lock
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && pip check \
    && tiletune-image-check server
USER 10001:10001
EXPOSE 8642
# /readyz answers 200 when the database does (SELECT 1); urlopen raises (exit 1) on anything else.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8642/readyz', timeout=4)"]
CMD ["tiletune", "server", "--host", "0.0.0.0", "--port", "8642"]
