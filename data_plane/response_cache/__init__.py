"""The response cache: answers of models whose config sets ``response_cache { enable: true }``,
kept in one server-wide store bounded in bytes (Triton's ``--cache-config local,size=N``).

:class:`ResponseCache` is the store (least recently used entries evicted under the bound, its
counters read by ``/metrics``); :class:`ModelResponseCache` is one loaded model version's way
into it, which the inference path asks before batching a request and fills after a miss;
:func:`request_key` names a request by what decides its answer; :func:`cache_config_overrides`
reads Triton's command-line form into the data plane's settings.
"""

from data_plane.response_cache.cache import CacheSnapshot, ResponseCache
from data_plane.response_cache.config import cache_config_overrides
from data_plane.response_cache.key import request_key
from data_plane.response_cache.model_cache import CacheLookup, ModelResponseCache

__all__ = [
    "CacheLookup",
    "CacheSnapshot",
    "ModelResponseCache",
    "ResponseCache",
    "cache_config_overrides",
    "request_key",
]
