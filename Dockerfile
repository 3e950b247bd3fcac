# Two images from one file:
#   --target agent   the host agent alone (modelyard_agent/: celery, redis, requests, tritonclient;
#                    no Django, boto3 or database driver), for serving hosts;
#   the default      the application (web via gunicorn, the orchestrator worker, celery beat);
#                    the command picks the role.
FROM python:3.11.10-slim-bookworm AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MODELYARD_VAR_DIR=/app/var

WORKDIR /app

# A fixed, unprivileged uid, so volumes shared with other containers (the model
# repository) can be given to it explicitly.
RUN groupadd --system --gid 10001 modelyard \
    && useradd --system --uid 10001 --gid modelyard --home-dir /app --shell /usr/sbin/nologin modelyard

# ---- the host agent: installs its own package and nothing else
FROM base AS agent
# Debian's nginx and its Lua module: the gateway the agent runs in front of Triton.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx libnginx-mod-http-lua lua-cjson \
    && rm -rf /var/lib/apt/lists/*
COPY modelyard_agent ./modelyard_agent
RUN pip install ./modelyard_agent \
    && mkdir -p /models /app/var \
    && chown -R modelyard:modelyard /models /app/var
USER modelyard
ENTRYPOINT ["modelyard-agent"]

# ---- the application
FROM base AS app
COPY requirements.txt ./
RUN pip install -r requirements.txt

COPY modelyard_agent ./modelyard_agent
RUN pip install --no-deps ./modelyard_agent
COPY manage.py ./
COPY modelyard ./modelyard
COPY audit ./audit
COPY accounts ./accounts
COPY registry ./registry
COPY deployments ./deployments
COPY monitoring ./monitoring
COPY promotions ./promotions
COPY templates ./templates
COPY static ./static

# Static files are collected at build time and served by WhiteNoise; the key is a
# throwaway that only lets settings load (no database is touched).
RUN MODELYARD_SECRET_KEY=collectstatic-only MODELYARD_DEBUG=false python manage.py collectstatic --noinput -v 0 \
    && mkdir -p /app/var /models \
    && chown -R modelyard:modelyard /app/var /models

USER modelyard
EXPOSE 8080

CMD ["gunicorn", "-c", "python:modelyard.gunicorn_config", "modelyard.wsgi", \
     "--bind", "0.0.0.0:8080", "--workers", "4", "--timeout", "300", \
     "--access-logfile", "-", "--error-logfile", "-"]
