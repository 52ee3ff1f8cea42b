# The service image: the API (`amct api`), the workers (`amct worker`), the one-shot `amct migrate`, and, run on
# its own (`docker run`), the embedded mode: API + worker + SQLite under the volume /var/lib/amct.
# docker-compose.yml is the production shape; docs/service.md, "Servers", says how to build, run and size it.
#
#   docker build -t amct-service .
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 -t amct-service:cuda .
#   docker build --build-arg BASE_IMAGE=… --build-arg WHEELHOUSE_ONLY=true .   (no registry: scripts/compose_smoke.sh)
ARG BASE_IMAGE=python:3.11-slim-bookworm

# -- build: a virtual environment with the dependencies and the project ----------------------------------
FROM ${BASE_IMAGE} AS build
# CPU torch from the PyTorch CPU index, so the dependencies never pull a CUDA build (GPU: the cu128 index).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# true: install only from docker/wheelhouse/ (filled by scripts/compose_smoke.sh), no index at all.
ARG WHEELHOUSE_ONLY=false
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
COPY docker/wheelhouse/ /wheelhouse/
# The dependencies first, from pyproject.toml alone: this layer is rebuilt only when they change.
COPY pyproject.toml README.md ./
RUN set -e; \
    if [ "$WHEELHOUSE_ONLY" = true ]; then src="--no-index"; torch_src="--no-index"; \
    else src=""; torch_src="--index-url $TORCH_INDEX"; fi; \
    pip install $torch_src --find-links /wheelhouse torch==2.13.0; \
    python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['service']))" > /tmp/requirements.txt; \
    pip install $src --find-links /wheelhouse -r /tmp/requirements.txt 'setuptools>=77' wheel
# Then the sources, and the project itself, after them (the `amct` command imports service/, worker/ …).
# Editable, so that the code and migrations/ + alembic.ini stay together under /app (core/db/migrate.py).
COPY amct_engine ./amct_engine
COPY core ./core
COPY service ./service
COPY worker ./worker
COPY job_host ./job_host
COPY job_process ./job_process
COPY migrations ./migrations
COPY alembic.ini ./
RUN pip install --no-index --no-deps --no-build-isolation -e . \
    && pip uninstall -y -q setuptools wheel \
    && python -c "import service.cli, worker.main, job_process"
# What torch's wheel ships for building and testing torch itself (C++ test binaries, protoc, the C++
# headers: nothing here compiles, no compiler is installed): about 190 MB of the image.
RUN cd /opt/venv/lib/python3.11/site-packages/torch \
    && rm -rf test include \
    && find bin -mindepth 1 -maxdepth 1 ! -name torch_shm_manager -exec rm -rf {} + \
    && cd / && python -c "import torch; torch.ones(2).sum()"

# -- the image: the base, bubblewrap, the environment and the code; no pip caches, no wheels, no compiler --
FROM ${BASE_IMAGE}
ENV PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH AMCT_DATA_DIR=/var/lib/amct
# bubblewrap: every child that loads a user model runs in it (docs/security.md); the service refuses user
# models without it. (A base image made by scripts/compose_smoke.sh has it already: no network needed.)
RUN command -v bwrap >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*; }
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
# Never root: user models run in child processes of this user, inside bubblewrap (an unprivileged user
# namespace: the container needs the security options docker-compose.yml sets, see docs/security.md).
RUN useradd --system --uid 10001 --home-dir /var/lib/amct --create-home amct
USER amct
# The embedded mode's SQLite, queue, artifacts and api-key; in docker-compose.yml, a worker's job folders.
VOLUME /var/lib/amct
EXPOSE 8000
# The embedded mode's and the API's check; docker-compose.yml gives the workers their own.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
# `docker run -p 127.0.0.1:8000:8000 --security-opt … amct-service`: the API with its embedded worker, so a
# submitted job runs (docs/service.md, "Servers"). Compose gives each service its own command.
CMD ["amct", "serve", "--host", "0.0.0.0", "--port", "8000"]
