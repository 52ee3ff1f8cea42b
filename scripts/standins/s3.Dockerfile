# A stand-in for MinIO when no registry answers (scripts/compose_smoke.sh): moto's S3 server, from wheels
# downloaded on the host, on the Debian stand-in base. In memory: its objects go with the container.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY wheels/ /wheels/
RUN python3 -m venv /opt/moto && /opt/moto/bin/pip install -q --no-cache-dir --no-index --find-links /wheels \
    'moto[s3,server]' && rm -rf /wheels
CMD ["/opt/moto/bin/moto_server", "-H", "0.0.0.0", "-p", "9000"]
