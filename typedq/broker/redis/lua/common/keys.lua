-- common/keys.lua: the shared prelude's first part (the parts and their order: README.md).
-- ARGV[1] is always the app's key prefix 'typedq:{<namespace>}:'. The key helpers
-- below mirror typedq/broker/redis/keys.py (a test checks that both agree). Every key of a
-- queue shares the queue's hash tag '{<namespace>:<queue>}', so one queue's keys live
-- in one cluster slot; a script learns which jobs it touches only while it runs and
-- derives their keys here from the queue (the caller declares a key of that queue's
-- slot in KEYS). Every helper of a queue's key takes the queue name first.
--
-- The strings derived from the app prefix alone, kept from one call to the next while
-- the prefix stays the same (one app makes every call, usually): 'tq:{<namespace>'
-- (what every queue's keys start with; 'typedq:{' is 8 characters), the channels, and
-- per queue its key prefixes and the keys of its own sets (active, levels, counts, ...:
-- the prefix and a fixed suffix). Made again for another prefix, and the per-queue
-- caches start over once they made KEEP_QUEUES prefixes or KEEP_KEYS keys (bounded
-- memory). They hold nothing but what the prefix and the queue names give, so keeping
-- them changes no answer; rebuilding them cost every call a dozen string
-- concatenations (each interns a new string: ~600 instructions) and two tables.
local app = {}  --@keep
local KEEP_QUEUES = 1000
local KEEP_KEYS = 4000
local function app_names(p)
  local a = app
  if a.p ~= p or a.made > KEEP_QUEUES or a.keys > KEEP_KEYS then
    a.p, a.pq, a.made, a.keys = p, 'tq:{' .. string.sub(p, 9, #p - 2), 0, 0
    a.w, a.d, a.x = p .. 'ev:w', p .. 'ev:d', p .. 'ev:x'
    a.q, a.j, a.k, a.dk = {}, {}, {}, {}
  end
  return a.pq, a.w, a.d, a.x, a.q, a.j, a.k, a.dk
end
local P = ARGV[1]
-- redis.call and redis.pcall, read once per call: every use then costs an upvalue, not two
-- table lookups (the global 'redis', its field). The helpers here and the scripts on a
-- worker's path (claim, complete, enqueue) use them: a few dozen commands per call.
local rcall, rpcall = redis.call, redis.pcall
-- qprefix: queue -> its keys' prefix; jprefix: queue -> its job keys' prefix; qkeys:
-- queue -> suffix -> key (k_fixed); qdone: queue -> state -> its done set's key.
local PQ, CH_WORK, CH_DONE, CH_CANCEL, qprefix, jprefix, qkeys, qdone = app_names(P)

-- A queue's key prefix, built once per queue (while the app prefix stays the same).
local function k_q(q)
  local p = qprefix[q]
  if not p then
    p = PQ .. ':' .. q .. '}:'
    qprefix[q] = p
    app.made = app.made + 1
  end
  return p
end
-- A job's key: the queue's tag and the id (no separator: an id starts with a letter or
-- digit, every other key of the queue continues the tag with ':').
local function k_job(q, id)
  local p = jprefix[q]
  if not p then
    p = PQ .. ':' .. q .. '}'
    jprefix[q] = p
    app.made = app.made + 1
  end
  return p .. id
end
-- The queue's key with the fixed `suffix`, made once (see app_names): the keys every call
-- names (the active set, the levels, the counts, ...) cost a table lookup, not a
-- concatenation.
local function k_fixed(q, suffix)
  local t = qkeys[q]
  if not t then t = {}; qkeys[q] = t end
  local k = t[suffix]
  if not k then
    k = k_q(q) .. suffix
    t[suffix] = k
    app.keys = app.keys + 1
  end
  return k
end
local function k_levels(q) return k_fixed(q, 'p') end
local function k_wait(q, prio) return k_q(q) .. 'w:' .. prio end
local function k_sched(q) return k_fixed(q, 's') end
local function k_counts(q) return k_fixed(q, 'n') end
local function k_stale(q) return k_fixed(q, 'z') end
-- The index of the queue's waiting entries (see below): IDX_BUCKETS small hashes, a
-- job's by the first 16 bits of the SHA1 of its id modulo IDX_BUCKETS (keys.py computes
-- the same; idx_bucket takes the low 13 bits: IDX_BUCKETS is 2^13). A batch of one queue
-- joins k_idx_prefix and idx_bucket itself.
-- IDX_BUCKETS (generated from the Python value: constants.py).
local function k_idx_prefix(q) return k_fixed(q, 'i:') end
-- The bucket's text without a string.format, a string.sub and a tonumber per job (~3k
-- instructions): the SHA1's first four hex digits read as bytes ('0'-'9': 48-57, 'a'-'f':
-- 97-102; sha1hex is lower case), their 16 bits taken modulo 8192 (the low 13 bits: the
-- first digit's lowest bit and the other three), and the number's text joined from kept
-- parts: the hundreds ('1'..'81') and two padded digits ('00'..'99'), or below 100 the
-- number's own ('0'..'99'): at most 281 strings, made once each (a cache of all 8192
-- texts would add 8192 strings for every GC cycle to mark). With `prefix` (the queue's
-- k_idx_prefix), the bucket's key, joined with the parts in one concatenation (one new
-- string per job, not two).
local idx_hundreds = {}  --@keep
local idx_padded = {}  --@keep
local idx_small = {}  --@keep
local function idx_bucket(id, prefix)
  local a, b, c, d = string.byte(redis.sha1hex(id), 1, 4)
  local n = ((a > 57 and a - 87 or a - 48) % 2) * 4096 + (b > 57 and b - 87 or b - 48) * 256
    + (c > 57 and c - 87 or c - 48) * 16 + (d > 57 and d - 87 or d - 48)
  local lo = n % 100
  if n < 100 then
    local t = idx_small[lo]
    if not t then t = string.format('%d', lo); idx_small[lo] = t end
    if prefix then return prefix .. t end
    return t
  end
  local hi = (n - lo) / 100
  local h, l = idx_hundreds[hi], idx_padded[lo]
  if not h then h = string.format('%d', hi); idx_hundreds[hi] = h end
  if not l then l = string.format('%02d', lo); idx_padded[lo] = l end
  if prefix then return prefix .. h .. l end
  return h .. l
end
local function k_idx(q, id) return idx_bucket(id, k_idx_prefix(q)) end
local function k_active(q) return k_fixed(q, 'a') end
-- (By state, made once per queue and state, like k_fixed's.)
local function k_done(q, state)
  local t = qdone[q]
  if not t then t = {}; qdone[q] = t end
  local k = t[state]
  if not k then
    k = k_q(q) .. 'd:' .. state
    t[state] = k
    app.keys = app.keys + 1
  end
  return k
end
local function k_seq(q) return k_fixed(q, 'o') end
local function k_qepoch(q) return k_q(q) .. 'e' end
local function k_req(q, tok) return k_q(q) .. 'r:' .. tok end
local function k_flow(q, f) return k_q(q) .. 'f:' .. f end
-- Limits (typedq/limits.py): a queue's gates (zset gate -> when it opens, µs; +inf: when
-- a concurrency slot frees), the waiting entries a gate parked ('<prio>|<id>', FIFO),
-- a rate bucket's start times in its window (zset), a concurrency bucket's slot holders.
-- A gate is '<r|c>|<task>|<key>'; a slot name ('ck' of the job hash) '<task>|<key>'.
local function k_gates(q) return k_fixed(q, 'G') end
local function k_gate(q, gate) return k_q(q) .. 'g:' .. gate end
-- Fair shares (typedq.fair): one key's waiting jobs of one level ('<task>|<key>' group),
-- the hash of the queue's lanes that have jobs ('<prio>|<group>' -> the weight of the
-- key's next turn) and, `changed`, the set of lanes whose weight changed since their
-- marker was written (common/lanes.lua lane_push).
local function k_lane(q, group, prio) return k_q(q) .. 'fk:' .. group .. ':' .. prio end
local function k_lanes(q, changed) return k_fixed(q, changed and 'FC' or 'F') end
-- The jobs gates hold parked now: id -> its gate (a gate's list also keeps stale entries).
local function k_parked(q) return k_fixed(q, 'P') end
local function k_rate(q, task, key) return k_q(q) .. 'rl:' .. task .. '|' .. key end
local function k_slots(q, slot) return k_q(q) .. 'cc:' .. slot end
-- App-wide names (off the job path).
local function k_worker(id) return P .. 'wk:' .. id end
-- Throughput rollups: per queue and minute (minutes since the epoch, Redis clock) a
-- hash c/f/r (completed, failed for good, retried) that expires ROLLUP_TTL_S after it
-- was first written, so the history is bounded (24 h) and survives restarts.
local function k_minute(q, minute) return k_q(q) .. 'h:' .. minute end
local ROLLUP_TTL_S = 25 * 3600
-- Events (typedq/events.py): a queue's capped stream, on while its config hash exists.
local function k_events(q) return k_q(q) .. 'ev' end
-- A job's stream (typedq/streams.py): the items its current run emitted.
local function k_jstream(q, id) return k_q(q) .. 'js:' .. id end
local function k_events_cfg(q) return k_fixed(q, 'E') end
-- A queue's own channels (Redis Cluster, see sharded.lua).
local function qch(q, kind) return k_q(q) .. 'ev:' .. kind end
-- Unique windows and debounce (typedq/flowcontrol.py, enqueue_controlled.lua): a unique
-- key's marker ('<task>|<key>' -> the id of the job holding it; expiring once that job
-- completed), the marker a job holds ('<window ms>|<task>|<key>', until it finishes),
-- a debounce key's marker (-> the id of the job collecting its enqueues).
local function k_unique(q, marker) return k_q(q) .. 'uk:' .. marker end
local function k_unique_job(q, id) return k_q(q) .. 'uj:' .. id end
local function k_debounce(q, marker) return k_q(q) .. 'db:' .. marker end
-- A queue's waiter mark: a claim that came up short sets it (its worker is about to
-- wait for work); the next call that gives the queue work deletes it and publishes the
-- work notice (publish), so enqueues while every worker is busy publish nothing.
local function k_waiter(q) return k_fixed(q, 'W') end
-- Direct hand-off (common/bookkeeping.lua's hand_off, handoff.lua): a queue's idle
-- workers' registrations, k_fixed(q, 'H') (hash: registration token -> its home
-- queue), and one registration's inbox on its home queue's slot, k_q(home) .. 'I:' ..
-- token (list; its ':c' string holds '<slots>|<lease_us>|<ttl_ms>|<worker>' while it
-- takes jobs, its ':h' list the '<queue>|<id>' of every job handed to it). (No helper
-- of their own: the library's main chunk holds at most 200 locals.)

-- Durable runs (typedq/broker/runs.py, common/runs.lua), on the run's queue: `kind`
-- 'u:' a run's record (hash), 'ul:' its log (list), 'uo:' its kept step outcomes
-- (hash), 'uS:' the names of its signals with an inbox (set), 'us:' one inbox per signal
-- (list; `r` is '<run id>|<signal>'), 'ud:' per final state (`r` its letter) the
-- queue's ended runs by end time. (One helper: the library's main chunk holds at most
-- 200 locals.)
local function k_run(q, kind, r) return k_q(q) .. kind .. r end
