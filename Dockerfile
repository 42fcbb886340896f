# syntax=docker/dockerfile:1
#
# tiletune images (BuildKit). Targets:
#   server       (default) the REST server; migrates its database, then serves on 8642.
#                Database from TILETUNE_DB_URL (unset: an SQLite file in /var/lib/tiletune).
#   worker-cpu   a worker that measures on the CPU; server from TILETUNE_SERVER.
#   worker-cuda  a worker for NVIDIA GPU nodes (torch's CUDA build, several GB on purpose;
#                run with the NVIDIA container toolkit: `docker run --gpus all ...`).
# The Ascend NPU worker image starts from a CANN base image instead:
# see deploy/kubernetes/worker-npu-daemonset.yaml.
#
#   docker build -t tiletune-server .
#   docker build --target worker-cpu -t tiletune-worker-cpu .

ARG PYTHON_IMAGE=python:3.11-slim
ARG TORCH_VERSION=2.13.0

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# The extras' requirement lists, read from pyproject.toml alone, so that the dependency
# layers below are rebuilt when pyproject.toml changes, not at every source edit.
FROM base AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python <<'PY'
import re
import tomllib
from pathlib import Path

project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
extras = project["optional-dependencies"]

def expand(name):
    for requirement in extras[name]:
        self_reference = re.fullmatch(r"tiletune\[([\w,-]+)\]", requirement)
        if self_reference:
            for inner in self_reference[1].split(","):
                yield from expand(inner)
        else:
            yield requirement

out = Path("/requirements")
out.mkdir()
for name in ("server", "worker"):
    lines = sorted({*project["dependencies"], *expand(name)})
    (out / f"{name}.txt").write_text("\n".join(lines) + "\n")
PY

FROM base AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY client/ client/
COPY kernels/ kernels/
COPY tuner/ tuner/
COPY service/ service/
COPY migrations/ migrations/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# Everything runs from a venv in /opt/tiletune (the same path the systemd units use),
# as an unprivileged user whose home holds the default SQLite file.
FROM base AS runtime
RUN groupadd --system --gid 10001 tiletune \
    && useradd --system --no-log-init --uid 10001 --gid tiletune --home-dir /var/lib/tiletune --create-home \
        --shell /usr/sbin/nologin tiletune \
    && python -m venv /opt/tiletune
ENV VIRTUAL_ENV=/opt/tiletune \
    PATH=/opt/tiletune/bin:$PATH
WORKDIR /var/lib/tiletune

# torch first, pinned, from the CPU index: no dependency range can pull a CUDA build after it
# (a 2.13.0+cpu install satisfies the extras' ranges), and the build fails if one slipped in.
FROM runtime AS cpu-torch
ARG TORCH_VERSION
RUN pip install --no-cache-dir --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
    && python -W ignore -c "import torch; assert torch.version.cuda is None, torch.__version__"

FROM cpu-torch AS worker-cpu
ARG TORCH_VERSION
RUN --mount=type=bind,from=requirements,source=/requirements,target=/tmp/requirements \
    pip install --no-cache-dir "torch==${TORCH_VERSION}" -r /tmp/requirements/worker.txt
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && pip check \
    && python -W ignore -c "import torch; assert torch.version.cuda is None, torch.__version__"
USER 10001:10001
# SIGTERM (docker stop) finishes the current trial and gives the lease back: allow it time,
# e.g. `docker stop -t 120`, compose's stop_grace_period, Kubernetes' terminationGracePeriodSeconds.
CMD ["tiletune", "worker", "--backend", "cpu"]

# PyPI's Linux x86_64 torch wheel is the CUDA build (CUDA libraries come as pip wheels);
# the driver comes from the host through the NVIDIA container toolkit.
FROM runtime AS worker-cuda
ARG TORCH_VERSION
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" \
    && python -c "import torch; assert torch.version.cuda, torch.__version__"
RUN --mount=type=bind,from=requirements,source=/requirements,target=/tmp/requirements \
    pip install --no-cache-dir "torch==${TORCH_VERSION}" -r /tmp/requirements/worker.txt
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && pip check
USER 10001:10001
CMD ["tiletune", "worker", "--backend", "cuda"]

# Last stage, so the default target. The server plans with the kernels' declarations, which are
# torch-free: its image holds no torch (the build fails if a dependency pulled one in).
FROM runtime AS server
RUN --mount=type=bind,from=requirements,source=/requirements,target=/tmp/requirements \
    pip install --no-cache-dir -r /tmp/requirements/server.txt
RUN --mount=type=bind,from=wheel,source=/wheels,target=/tmp/wheels \
    pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
    && pip check \
    && python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
USER 10001:10001
EXPOSE 8642
# /healthz answers 200 when the database does; urlopen raises (exit 1) on anything else.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8642/healthz', timeout=4)"]
CMD ["tiletune", "server", "--host", "0.0.0.0", "--port", "8642"]
