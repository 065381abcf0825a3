#!/bin/sh
# Migrations are a deploy step, not something a server does under running workers:
# bring the schema to this image's head, then hand the process over (exec) so that
# SIGTERM reaches the server directly.
set -eu
: "${WS_TUNE_DB:?set WS_TUNE_DB to the PostgreSQL URL}"
ws-tune db upgrade
exec "$@"
