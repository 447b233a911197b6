# The image compose.yaml builds: checkbeat with Flower, run as an unprivileged user.
#
# The image runs the wheel a user installs, not the source tree: the build stage makes the sdist
# and, from it, the wheel (`python -m build`), and the final stage installs only that wheel, so a
# file the packaging leaves out is missing here exactly as it is for `pip install checkbeat`.
# tests/test_dockerfile.py builds the same wheel from the same files and compares it with the tree.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY scheduling_core ./scheduling_core
COPY celery_app ./celery_app
COPY beat ./beat
COPY workers ./workers
RUN pip install --no-cache-dir build && python -m build --outdir /dist

FROM python:3.11-slim
# No source in this stage: `celery -A celery_app` in WORKDIR imports the installed packages.
WORKDIR /app
COPY --from=build /dist/*.whl /wheels/
# `set --` expands the wheel's file name; the extra is appended outside the glob.
RUN set -- /wheels/checkbeat-*.whl && pip install --no-cache-dir "$1[local]" \
    && rm -r /wheels && useradd --create-home checkbeat
USER checkbeat
CMD ["celery", "-A", "celery_app", "worker", "--role", "shared", "-P", "threads", "-E"]
