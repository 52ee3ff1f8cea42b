# The service image: API (`python -m service serve --no-worker`) and workers (`python -m service worker`).
# Build: docker build -t amct-service .   (docker-compose.yml shows the production shape)
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    AMCT_DATA_DIR=/var/lib/amct
WORKDIR /app

# CPU torch first, from the PyTorch CPU index, so the service extra never pulls a CUDA build.
# (GPU workers: build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128.)
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# bubblewrap: every child that loads a user model runs in it (docs/security.md); the service refuses
# user models without it. It brings libseccomp2, which the sandbox's seccomp filter is built with.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
RUN pip install --index-url "$TORCH_INDEX" torch==2.13.0

COPY pyproject.toml README.md ./
COPY amct_engine ./amct_engine
RUN pip install '.[service]'
COPY service ./service
COPY worker ./worker
COPY core ./core
COPY job_host ./job_host
COPY job_process ./job_process
COPY migrations ./migrations
COPY alembic.ini ./

# Never root: user models run in child processes of this user, inside bubblewrap (an unprivileged user
# namespace: the container needs the security options docker-compose.yml sets, see docs/security.md).
RUN useradd --system --uid 10001 --home-dir /var/lib/amct --create-home amct
USER amct
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["python", "-m", "service", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-worker"]
