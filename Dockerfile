# The image compose.yaml builds: checkbeat with Flower, run as an unprivileged user.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY scheduling_core ./scheduling_core
COPY celery_app ./celery_app
COPY beat ./beat
COPY workers ./workers
RUN pip install --no-cache-dir '.[local]' && useradd --create-home checkbeat
USER checkbeat
CMD ["celery", "-A", "celery_app", "worker", "--role", "shared", "-P", "threads", "-E"]
