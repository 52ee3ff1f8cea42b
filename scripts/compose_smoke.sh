#!/usr/bin/env bash
# The compose stack, end to end, without an image registry (docs/service.md, "Servers"; `make compose-smoke`):
#   1. base images: the official ones when a registry answers; else Debian ones made with mmdebstrap and
#      `docker import` (Python for the project; PostgreSQL, Redis and moto's S3 server as stand-ins,
#      scripts/compose.standins.yml);
#   2. the project image, from wheels downloaded here (torch: the on-disk CPU wheel pip's config points at);
#   3. ROUNDS times, on fresh volumes: `docker compose up --wait`, every service healthy, `amct admin
#      create-project`, a key, one small quant_retrain job through the API, it succeeds, /readyz says the
#      sandbox is ok and a cpu worker is registered; then `down -v`;
#   4. STARTS more fresh starts (no job): each must reach a ready API with a registered worker.
# Usage: scripts/compose_smoke.sh [--rounds N] [--starts N] [--keep]. Needs root (or the docker group),
# Docker Engine, Compose v2, and mmdebstrap when no registry answers. Not run in CI (minutes, a Docker daemon).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=2 STARTS=0 KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --starts) STARTS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    *) echo "usage: $0 [--rounds N] [--starts N] [--keep]" >&2; exit 2 ;;
  esac
done

WORK=build/compose-smoke
PROJECT=amct-smoke
IMAGE=amct-service:smoke
API_PORT=${SMOKE_API_PORT:-18000}
PY=${PY:-python3.11}  # downloads the wheels: the image's Python minor version (cp311)
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$WORK"

say() { printf '[smoke %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { say "FAILED: $*"; exit 1; }
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

docker compose version >/dev/null 2>&1 || die "Compose v2 (\`docker compose\`) is missing; docker-compose 1.x cannot run this stack"
docker info >/dev/null 2>&1 || die "no Docker daemon answers"

# -- 1. base images ---------------------------------------------------------------------------------
OFFICIAL=(postgres:16.9-bookworm redis:7.4.2-bookworm minio/minio:RELEASE.2025-04-22T22-12-26Z python:3.11-slim-bookworm)
registry=1
for image in "${OFFICIAL[@]}"; do
  docker image inspect "$image" >/dev/null 2>&1 && continue
  timeout 120 docker pull -q "$image" >/dev/null 2>&1 || { registry=0; break; }
done

debian_image() {  # name, packages: a minbase Debian 12 image from Debian's packages, made once
  docker image inspect "$1" >/dev/null 2>&1 && return
  command -v mmdebstrap >/dev/null || die "no registry answers and mmdebstrap is missing (apt-get install mmdebstrap)"
  say "making $1 with mmdebstrap ($2)"
  mmdebstrap --quiet --variant=minbase --include="$2" bookworm - "$DEBIAN_MIRROR" | docker import - "$1" >/dev/null
}

COMPOSE_FILES=(-f docker-compose.yml)
if [ "$registry" = 1 ]; then
  say "registry answers: official images"
  BASE=python:3.11-slim-bookworm
else
  say "no registry answers: Debian base images and stand-ins (scripts/compose.standins.yml)"
  BASE=amct-smoke/debian-python:bookworm
  debian_image "$BASE" python3,python3-venv,bubblewrap,ca-certificates
  debian_image amct-smoke/debian-standins:bookworm postgresql-15,redis-server,redis-tools,python3-venv,ca-certificates
  if ! docker image inspect amct-smoke/s3-standin:bookworm >/dev/null 2>&1; then
    rm -rf "$WORK/s3" && mkdir -p "$WORK/s3/wheels"
    "$PY" -m pip download -q --only-binary=:all: -d "$WORK/s3/wheels" 'moto[s3,server]==5.2.5'
    DOCKER_BUILDKIT=0 docker build -q --build-arg BASE_IMAGE=amct-smoke/debian-standins:bookworm \
      -f scripts/standins/s3.Dockerfile -t amct-smoke/s3-standin:bookworm "$WORK/s3" >/dev/null
  fi
  COMPOSE_FILES+=(-f scripts/compose.standins.yml)
fi

# -- 2. the project image -----------------------------------------------------------------------------
# Every wheel the image needs, downloaded here, so the build needs no index: torch first and alone (pip's
# config finds the on-disk CPU wheel), then the rest with that torch in reach. async-timeout: redis needs it
# on Debian's Python 3.11.2 (< 3.11.3), which this host's newer 3.11 does not.
say "wheels for the image ($PY)"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d docker/wheelhouse torch==2.13.0 2>&1 | grep -v '^WARNING: Location' || true
ls docker/wheelhouse/torch-2.13.0+cpu-*.whl >/dev/null 2>&1 || die "pip found no CPU wheel of torch 2.13.0 (see pip's find-links)"
"$PY" -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['service']))" > "$WORK/requirements.txt"
"$PY" -m pip download -q --only-binary=:all: --find-links docker/wheelhouse -d docker/wheelhouse \
  -r "$WORK/requirements.txt" 'setuptools>=77' wheel 'async-timeout>=4.0.3' 2>&1 | grep -v '^WARNING: Location' || true

say "building $IMAGE on $BASE"
t0=$(now)
# The classic builder: Debian 12's docker.io has no buildx.
DOCKER_BUILDKIT=0 docker build -q --build-arg BASE_IMAGE="$BASE" --build-arg WHEELHOUSE_ONLY=true -t "$IMAGE" . \
  > "$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; die "image build"; }
say "built in $(since "$t0") s; size $(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')"

# -- 3. rounds on fresh volumes ------------------------------------------------------------------------------
secret() { python3 -c "import secrets; print(secrets.token_urlsafe(18))"; }
ENV_FILE=$WORK/smoke.env
cat > "$ENV_FILE" <<EOF
POSTGRES_PASSWORD=$(secret)
MINIO_ROOT_USER=amct
MINIO_ROOT_PASSWORD=$(secret)
AMCT_API_BIND=127.0.0.1
AMCT_API_PORT=$API_PORT
MINIO_CONSOLE_PORT=$((API_PORT + 1001))
AMCT_API_PROCESSES=2
AMCT_CPU_CONCURRENCY=1
AMCT_IMAGE=$IMAGE
EOF
compose() { docker compose --env-file "$ENV_FILE" -p "$PROJECT" "${COMPOSE_FILES[@]}" "$@"; }
teardown() { [ "$KEEP" = 1 ] || compose down -v --remove-orphans >/dev/null 2>&1 || true; }
trap teardown EXIT

# Up on fresh volumes; prints the seconds until every service is healthy (one-shots exited 0).
fresh_up() {
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  local t0; t0=$(now)
  if ! compose up -d --no-build --wait --wait-timeout 240 > "$WORK/up.log" 2>&1; then
    tail -20 "$WORK/up.log" >&2; compose ps -a >&2; compose logs --tail 30 >&2; return 1
  fi
  since "$t0"
}

# Every long-running service healthy, every one-shot exited 0.
all_healthy() {
  compose ps -a --format '{{.Service}} {{.State}} {{.Health}} {{.ExitCode}}' | awk '
    $2 == "exited" && $NF == 0 { next }
    $2 == "running" && $3 == "healthy" { next }
    { bad = bad " " $0 } END { if (bad) { print "not healthy:" bad; exit 1 } }'
}

# /readyz: ready, sandbox ok, a cpu worker registered.
ready_with_worker() {
  curl -fsS "http://127.0.0.1:$API_PORT/readyz" | python3 -c "
import json, sys
r = json.load(sys.stdin)
ok = r['status'] == 'ready' and r['checks']['sandbox'] == 'ok' and 'cpu' in r['workers']['devices']
print(json.dumps(r['checks']), 'devices:', r['workers']['devices'])
sys.exit(0 if ok else 1)"
}

run_job() {
  compose exec -T api amct admin create-project x >/dev/null || die "amct admin create-project x"
  local key job status
  key=$(compose exec -T api amct admin create-key x --scope write --name smoke 2>/dev/null)
  compose exec -T api python - /tmp/smoke < scripts/smoke_job_files.py >/dev/null
  local t0; t0=$(now)
  job=$(compose exec -T -e AMCT_API_KEY="$key" api amct jobs submit --model /tmp/smoke/model.pt \
    --cfg /tmp/smoke/quant.cfg --data /tmp/smoke/data.npz --kind quant_retrain --epochs 1 \
    --server http://127.0.0.1:8000 2>/dev/null | head -1)
  [ -n "$job" ] || die "submit"
  for _ in $(seq 120); do
    status=$(curl -fsS -H "Authorization: Bearer $key" "http://127.0.0.1:$API_PORT/v1/jobs/$job" \
      | python3 -c "import json, sys; print(json.load(sys.stdin)['status'])")
    case "$status" in succeeded | failed | cancelled) break ;; esac
    sleep 1
  done
  say "job $job: $status in $(since "$t0") s (upload, queue, run)"
  [ "$status" = succeeded ] || { compose logs --tail 40 worker-cpu; die "job $job ended $status"; }
}

for round in $(seq "$ROUNDS"); do
  say "round $round/$ROUNDS: up on fresh volumes"
  secs=$(fresh_up) || die "round $round: the stack did not come up healthy"
  say "round $round: all healthy in $secs s"
  compose ps -a --format 'table {{.Service}}\t{{.Status}}'
  all_healthy || die "round $round"
  readyz=$(ready_with_worker) || die "round $round: not ready with a worker: $readyz"
  say "round $round: readyz $readyz"
  run_job
  ready_with_worker >/dev/null || die "round $round: not ready after the job"
  say "round $round: passed"
done

# -- 4. fresh starts ---------------------------------------------------------------------------------
if [ "$STARTS" -gt 0 ]; then
  ok=0 times=()
  for i in $(seq "$STARTS"); do
    if secs=$(fresh_up) && all_healthy >/dev/null && ready_with_worker >/dev/null; then
      ok=$((ok + 1)); times+=("$secs")
    else
      say "start $i: NOT ready"; compose logs --tail 20 api worker-cpu > "$WORK/start-$i.log" 2>&1 || true
    fi
  done
  say "fresh starts: $ok/$STARTS ready with a registered worker; seconds to all healthy: ${times[*]}"
  [ "$ok" = "$STARTS" ] || die "$((STARTS - ok)) of $STARTS starts not ready"
fi
say "PASSED"
