# ws-tune API server (no GPU, no CUDA, no torch, no tilelang): the REST API over the shared PostgreSQL.
#   docker build -f docker/server.Dockerfile -t ws-tune-server .
# The server stores kernel sources but never imports them (tests/server/test_server_image.py
# runs it where importing torch or tilelang fails), so it installs every runtime dependency
# of pyproject.toml but those two, at the versions CI tests (constraints.txt), then ws-tune itself.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --create-home --uid 10001 wstune
WORKDIR /opt/ws-tune

COPY pyproject.toml constraints.txt README.md ./
RUN python3 -c "import re, tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; \
print('\n'.join(d for d in deps if re.match(r'[A-Za-z0-9_.-]+', d)[0] not in ('torch', 'tilelang')))" > /tmp/server-requirements.txt \
 && pip install -c constraints.txt -r /tmp/server-requirements.txt
COPY ws_tuner ./ws_tuner
COPY server ./server
COPY migrations ./migrations
RUN pip install --no-deps .
COPY examples /opt/ws-tune/kernels
COPY docker/prestart.sh /usr/local/bin/ws-tune-prestart
RUN chmod 0755 /usr/local/bin/ws-tune-prestart

USER wstune
# Every setting is WS_TUNE_*: see configs/service.toml and configs/service.env.example.
ENV WS_TUNE_HOST=0.0.0.0 WS_TUNE_PORT=8000 WS_TUNE_WORKERS=0 WS_TUNE_KERNEL_DIRS=/opt/ws-tune/kernels
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/api/v1/health', timeout=2).status != 200)"
# Migrations first (ws-tune db upgrade), then the server; exec keeps signals reaching it.
ENTRYPOINT ["ws-tune-prestart"]
CMD ["ws-tune", "serve"]
