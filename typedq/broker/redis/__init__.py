"""The Redis broker (``redis://``, ``rediss://``, ``unix://``): durable, shared, batch-first.

Every state transition is one Lua script from ``lua/``, a function of one Redis Functions
library (:mod:`.scripts`; loaded at connect, loaded again when Redis answers "Function not
found"), so a job is never half-moved. Key names live in
:mod:`typedq.broker.redis.keys`; every key of a queue shares the queue's hash tag
(``{<app>:<queue>}``), so on Redis Cluster (``redis+cluster://``) queues spread over the
shards and each script runs on the one slot of its queue.

Waiting for work, for results and for cancel requests blocks on one dedicated
pub/sub connection per broker (no polling; :mod:`.listener`): scripts ``PUBLISH`` when a queue gets
work, when jobs reach a final state, and when a running job is asked to cancel.
Every (re)subscription counts as a notification, so nothing published while the
connection was down is missed: waiters look at Redis again.

Client settings are in :mod:`.connection`. Automatic retries are safe because every
script is idempotent when re-sent, and a re-sent script answers what its first copy
answered: claim, enqueue and cancel carry a token the client makes per call, and
the script keeps its answer under that token for a minute (``P r:<token>``), so a
re-sent claim returns the same jobs, a re-sent enqueue still answers
``created=True`` for the jobs its first copy created and a re-sent cancel still
answers ``CANCELLED``; finishes fenced by a token answer ``ALREADY_FINISHED`` the
second time.

Maxmemory: at the limit (``noeviction``), Redis refuses enqueues (and progress
writes) whole, with :class:`~typedq.errors.BrokerError` naming maxmemory; every
script that moves, finishes or deletes jobs (claim, complete, fail, release, renew,
recover, cancel, retry, remove, purge) carries ``#!lua flags=allow-oom`` (its function's
flag) and keeps
running, so workers drain the backlog and retention frees memory; so does a worker's
registry heartbeat (one small key per worker), so a draining worker stays listed. A worker's
recovery pass looks at ``INFO memory`` at most every :data:`MEMORY_CHECK_INTERVAL`
seconds and logs one warning when Redis reaches maxmemory and one info line when it
is below again.

Memory: a job that no worker has claimed yet is one Redis string (a short text
header and the compact job body), not a hash: a hash whose envelope field is over
Redis's default ``hash-max-listpack-value`` (64 bytes) falls back to the hashtable
encoding, more than twice the size. Claim and cancel turn the string into the job
hash. The layout is in :mod:`typedq.broker.redis.keys`.

Data loss: on connect the broker writes the app's epoch key if it is missing and
remembers its value; :meth:`RedisBroker.check_epoch` (run at most every
:data:`EPOCH_CHECK_INTERVAL` seconds, by a worker's recovery pass or before an enqueue)
notices when it vanished or changed, logs one error, records
:class:`~typedq.errors.RedisDataLost` in ``data_lost`` and carries on with the new
epoch. Connect also warns when Redis runs without AOF (no persistence at all when it
has taken no RDB snapshot either).
"""

from .broker import RedisBroker
from .connection import CONNECT_TIMEOUT, HEALTH_CHECK_INTERVAL, RETRIES, SOCKET_TIMEOUT
from .health import EPOCH_CHECK_INTERVAL, MEMORY_CHECK_INTERVAL

__all__ = [
    "CONNECT_TIMEOUT",
    "EPOCH_CHECK_INTERVAL",
    "HEALTH_CHECK_INTERVAL",
    "MEMORY_CHECK_INTERVAL",
    "RETRIES",
    "SOCKET_TIMEOUT",
    "RedisBroker",
]
