"""What the Redis store keeps where, and the Lua scripts that change several keys at once.

Layout, every key under ``key_prefix`` (``zeroserve:`` by default):

    models                      hash   name -> ModelRecord JSON
    workers                     hash   worker id -> WorkerRecord JSON
    placements                  hash   JSON ``[model, worker_id]`` -> Placement JSON
    sleeping                    hash   JSON ``[model, worker_id]`` -> Placement JSON (asleep)
    activation-requests         zset   model -> when its pending request lapses (server ms)
    first-responses             zset   FirstResponse JSON -> when it lapses (server ms)
    timeline:<model>            list   cold-start timelines as JSON, newest first, capped
    traffic:<model>             hash   activator id -> TrafficReport JSON
    traffic-expiry:<model>      zset   activator id -> when that report lapses (server ms)
    lease                       string the acting control plane's holder id, with a PX ttl
    keys                        hash   API key id -> ApiKeyRecord JSON (a secret's hash only)

    events:placements           channel  {"kind": "added"|"removed", "placement": {...}}
    events:activations          channel  model name
    events:first-responses      channel  FirstResponse JSON
    events:key-revocations      channel  a revoked key's id

All placements share one hash: there are hundreds at most, and removing a worker's or a
model's placements is then one atomic scan of one key.

Writes that must be seen together (a placement and its event, a worker and its placements)
run as one Lua script, so an event is published in the same atomic step as the change it
describes and subscribers see changes in the order they happened. Expiries use the server's
clock (``TIME`` inside scripts, ``PX``), never a replica's. Scripts touch several keys at
once, so the store needs Redis 6 or newer with cluster mode disabled (one shard; read
replicas and failover are fine).
"""

from __future__ import annotations

from redis.asyncio import Redis

__all__ = ["Keys", "Scripts"]


class Keys:
    """The name of every key and channel, under one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.models = prefix + "models"
        self.workers = prefix + "workers"
        self.placements = prefix + "placements"
        self.sleeping = prefix + "sleeping"
        self.activation_requests = prefix + "activation-requests"
        self.first_responses = prefix + "first-responses"
        self.lease = prefix + "lease"
        self.placement_channel = prefix + "events:placements"
        self.activation_channel = prefix + "events:activations"
        self.first_response_channel = prefix + "events:first-responses"
        self.api_keys = prefix + "keys"
        self.key_revocation_channel = prefix + "events:key-revocations"

    def timeline(self, model: str) -> str:
        return f"{self.prefix}timeline:{model}"

    def traffic(self, model: str) -> str:
        return f"{self.prefix}traffic:{model}"

    def traffic_expiry(self, model: str) -> str:
        return f"{self.prefix}traffic-expiry:{model}"

    def model_state(self, model: str) -> str:
        return f"{self.prefix}model-state:{model}"


_NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: models. ARGV: name, record JSON, expected generation ('' for any).
# -> 1 replaced, 0 absent or of another generation. A record already equal to the new one
# counts as replaced, so a replay after a lost answer succeeds.
_UPDATE_MODEL = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
if not current then return 0 end
if ARGV[3] ~= '' and current ~= ARGV[2]
    and cjson.decode(current)['generation'] ~= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# Removes every placement whose JSON field ``field`` equals ``value``, publishing REMOVED.
_REMOVE_PLACEMENTS_WHERE = """
local function remove_placements_where(hash, field, value, channel)
  local entries = redis.call('HGETALL', hash)
  for i = 1, #entries, 2 do
    if cjson.decode(entries[i + 1])[field] == value then
      redis.call('HDEL', hash, entries[i])
      redis.call('PUBLISH', channel, '{"kind":"removed","placement":' .. entries[i + 1] .. '}')
    end
  end
end
"""

# Removes every sleeping replica whose JSON field ``field`` equals ``value`` (no event).
_REMOVE_SLEEPING_WHERE = """
local function remove_sleeping_where(hash, field, value)
  local entries = redis.call('HGETALL', hash)
  for i = 1, #entries, 2 do
    if cjson.decode(entries[i + 1])[field] == value then redis.call('HDEL', hash, entries[i]) end
  end
end
"""

# KEYS: models, placements, timeline, traffic, traffic-expiry, activation-requests, sleeping.
# ARGV: name, placement channel. -> 1 if the record existed.
_DELETE_MODEL = (
    _REMOVE_PLACEMENTS_WHERE
    + _REMOVE_SLEEPING_WHERE
    + """
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
remove_placements_where(KEYS[2], 'model', ARGV[1], ARGV[2])
remove_sleeping_where(KEYS[7], 'model', ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
redis.call('ZREM', KEYS[6], ARGV[1])
return existed
"""
)

# KEYS: workers, placements, sleeping. ARGV: worker id, placement channel.
_REMOVE_WORKER = (
    _REMOVE_PLACEMENTS_WHERE
    + _REMOVE_SLEEPING_WHERE
    + """
redis.call('HDEL', KEYS[1], ARGV[1])
remove_placements_where(KEYS[2], 'worker_id', ARGV[1], ARGV[2])
remove_sleeping_where(KEYS[3], 'worker_id', ARGV[1])
return 1
"""
)

# KEYS: placements, activation-requests. ARGV: field, placement JSON, model, channel.
_ADD_PLACEMENT = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('PUBLISH', ARGV[4], '{"kind":"added","placement":' .. ARGV[2] .. '}')
return 1
"""

# KEYS: placements. ARGV: field, channel. -> 1 removed, 0 absent.
_REMOVE_PLACEMENT = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], '{"kind":"removed","placement":' .. raw .. '}')
return 1
"""

# KEYS: activation-requests. ARGV: model, pending ttl ms, channel. -> 1 published, 0 pending.
_REQUEST_ACTIVATION = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""
)

# KEYS: activation-requests. -> pending model names.
_PENDING_ACTIVATIONS = (
    _NOW_MS
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)

# KEYS: first-responses. ARGV: report JSON, ttl ms, channel.
_REPORT_FIRST_RESPONSE = (
    _NOW_MS
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
-- The key vanishes once nothing was reported for a ttl.
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""
)

# KEYS: first-responses. -> kept report JSONs, oldest first.
_KEPT_FIRST_RESPONSES = (
    _NOW_MS
    + """
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""
)

# KEYS: traffic, traffic-expiry. ARGV: activator id, report JSON, ttl ms.
_REPORT_TRAFFIC = (
    _NOW_MS
    + """
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
-- Both keys vanish once no activator has reported for a ttl.
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
"""
)

# KEYS: traffic, traffic-expiry. -> unexpired report JSONs.
_TRAFFIC = (
    _NOW_MS
    + """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, activator in ipairs(expired) do redis.call('HDEL', KEYS[1], activator) end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return redis.call('HVALS', KEYS[1])
"""
)

# KEYS: timeline. ARGV: id, timeline JSON. -> 1 replaced, 0 not kept.
_UPDATE_ACTIVATION = """
local entries = redis.call('LRANGE', KEYS[1], 0, -1)
for i, raw in ipairs(entries) do
  local ok, doc = pcall(cjson.decode, raw)
  if ok and type(doc) == 'table' and doc['id'] == ARGV[1] then
    redis.call('LSET', KEYS[1], i - 1, ARGV[2])
    return 1
  end
end
return 0
"""

# KEYS: lease. ARGV: holder, ttl ms. Renews the holder's own lease, or takes one that lapsed
# between the caller's SET NX and this script. -> 1 held, 0 another holder has it.
_RENEW_LEASE = """
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not current then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

# KEYS: keys. ARGV: id, revoked record JSON, channel. -> 1 stored and published, 0 absent.
_REVOKE_KEY = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
"""

# KEYS: lease. ARGV: holder. Deletes only the holder's own lease.
_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Scripts:
    """Every script above, registered on one client: each runs by its SHA, and is loaded
    into the server the first time the server does not know it (after a restart too)."""

    def __init__(self, client: Redis) -> None:
        register = client.register_script
        self.update_model = register(_UPDATE_MODEL)
        self.delete_model = register(_DELETE_MODEL)
        self.remove_worker = register(_REMOVE_WORKER)
        self.add_placement = register(_ADD_PLACEMENT)
        self.remove_placement = register(_REMOVE_PLACEMENT)
        self.request_activation = register(_REQUEST_ACTIVATION)
        self.pending_activations = register(_PENDING_ACTIVATIONS)
        self.report_first_response = register(_REPORT_FIRST_RESPONSE)
        self.kept_first_responses = register(_KEPT_FIRST_RESPONSES)
        self.update_activation = register(_UPDATE_ACTIVATION)
        self.report_traffic = register(_REPORT_TRAFFIC)
        self.traffic = register(_TRAFFIC)
        self.renew_lease = register(_RENEW_LEASE)
        self.release_lease = register(_RELEASE_LEASE)
        self.revoke_key = register(_REVOKE_KEY)
