"""The key names of this deployment's state store: :class:`Keys` tagged for a Redis Cluster
when ``CHECKBEAT_REDIS_URL`` is a ``redis+cluster://`` URL, today's names otherwise.

Why the tags follow the URL rather than being always on: plain and Sentinel deployments have live
data under the untagged names, and renaming them would orphan it; a cluster deployment starts
empty (docs/high-availability.md, "Redis Cluster", says how to move one).
"""

from __future__ import annotations

from celery_app.cluster_url import is_cluster_url
from celery_app.redis.schema import Keys
from celery_app.settings import Settings


def state_keys(settings: Settings) -> Keys:
    """Every component's ``Keys``: one definition of the prefix and of the tagging."""
    return Keys(
        settings.key_prefix,
        cluster=is_cluster_url(settings.redis_url),
        partitions=settings.check_partitions,
    )
