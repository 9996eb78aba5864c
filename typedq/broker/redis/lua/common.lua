-- typedq common prelude, inserted by the loader right after each script's shebang.
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
local IDX_BUCKETS = 8192
local function k_idx_prefix(q) return k_fixed(q, 'i:') end
-- The bucket's text without a string.format, a string.sub and a tonumber per job (~3k
-- instructions): the SHA1's first four hex digits read as bytes ('0'-'9': 48-57, 'a'-'f':
-- 97-102; sha1hex is lower case), their 16 bits taken modulo 8192 (the low 13 bits: the
-- first digit's lowest bit and the other three), and the number's text joined from kept
-- parts: the hundreds ('1'..'81') and two padded digits ('00'..'99'), or below 100 the
-- number's own ('0'..'99'): at most 281 strings, made once each (a cache of all 8192
-- texts would add 8192 strings for every GC cycle to mark).
local idx_hundreds = {}  --@keep
local idx_padded = {}  --@keep
local idx_small = {}  --@keep
local function idx_bucket(id)
  local a, b, c, d = string.byte(redis.sha1hex(id), 1, 4)
  local n = ((a > 57 and a - 87 or a - 48) % 2) * 4096 + (b > 57 and b - 87 or b - 48) * 256
    + (c > 57 and c - 87 or c - 48) * 16 + (d > 57 and d - 87 or d - 48)
  local lo = n % 100
  if n < 100 then
    local t = idx_small[lo]
    if not t then t = string.format('%d', lo); idx_small[lo] = t end
    return t
  end
  local hi = (n - lo) / 100
  local h, l = idx_hundreds[hi], idx_padded[lo]
  if not h then h = string.format('%d', hi); idx_hundreds[hi] = h end
  if not l then l = string.format('%02d', lo); idx_padded[lo] = l end
  return h .. l
end
local function k_idx(q, id) return k_idx_prefix(q) .. idx_bucket(id) end
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
local function k_events_cfg(q) return k_fixed(q, 'E') end
-- A queue's own channels (Redis Cluster, see sharded.lua).
local function qch(q, kind) return k_q(q) .. 'ev:' .. kind end
-- A queue's waiter mark: a claim that came up short sets it (its worker is about to
-- wait for work); the next call that gives the queue work deletes it and publishes the
-- work notice (publish), so enqueues while every worker is busy publish nothing.
local function k_waiter(q) return k_fixed(q, 'W') end

-- Every timestamp, lease deadline and delay uses the Redis clock, in integer
-- microseconds (exact in a Lua double).
-- The last time read (nil: none yet), for bookkeeping that needs no fresher one.
local last_now = nil
-- The same as decimal text: what a command is given (a Lua number passed to redis.call
-- is formatted with '%.17g', several times the cost of the command itself).
local last_now_text = nil
local function now_us()
  local t = rcall('TIME')
  last_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  last_now_text = t[1] .. string.sub('00000' .. t[2], -6)
  return last_now
end
-- Integer `n` as decimal text, for a command's argument (see last_now_text).
local function num_text(n)
  if n == last_now then return last_now_text end
  if n == 1 then return '1' elseif n == -1 then return '-1' elseif n == 0 then return '0' end
  -- Past 2^53 (or not whole): Redis formats it, as it did before.
  if n >= 9007199254740992 or n <= -9007199254740992 or n ~= math.floor(n) then return n end
  return string.format('%d', n)
end

-- Decimal text of a count `n` >= 1 (a claimed job's place in its claim, in its token):
-- made once per value up to 1000 and kept (a number concatenated is formatted with
-- '%.14g': ~1.5k instructions; the same text for an integer).
local count_texts = {}  --@keep
local function count_text(n)
  local t = count_texts[n]
  if not t then
    t = string.format('%d', n)
    if n <= 1000 then count_texts[n] = t end
  end
  return t
end

local function bad_args(script)
  return redis.error_reply('ERR typedq ' .. script .. ': malformed arguments')
end

local function is_int(v)
  local n = tonumber(v)
  return n ~= nil and n == math.floor(n)
end

-- A job no worker has claimed yet is one string (see keys.py):
--   <state>|<order>|<enqueued_at>|<priority>|<run_at>|<body>
-- with state 'w' or 's', priority empty for 0, run_at empty unless scheduled. The
-- queue is the key's (`q`); records of the previous layout name it after the state
-- letter and are still read. Anything else in a job string is bytes typedq did not
-- write (parse_rec: nil).
local function parse_rec(v, q)
  local s, rq, o, e, p, r, at = string.match(v, '^([ws])([^|]*)|(%d+)|(%d+)|(%-?%d*)|(%d*)|()')
  if not s then return nil end
  if rq ~= '' then q = rq end
  if p == '' then p = false end
  if r == '' then r = false end
  return {s = s, q = q, o = o, e = e, p = p, r = r, m = string.sub(v, at)}
end

local function int_text(v)
  if type(v) == 'number' then return string.format('%d', v) end
  return v
end

local function pack_rec(f)
  return f.s .. '|' .. int_text(f.o) .. '|' .. int_text(f.e) .. '|' .. (f.p or '')
    .. '|' .. (f.r and int_text(f.r) or '') .. '|' .. f.m
end

-- The fields of a job string as the job hash would hold them.
local function rec_fields(f)
  local t = {'m', f.m, 'q', f.q, 's', f.s, 'o', f.o, 'e', f.e}
  if f.p and f.p ~= '0' then t[#t + 1] = 'p'; t[#t + 1] = f.p end
  if f.r then t[#t + 1] = 'r'; t[#t + 1] = f.r end
  return t
end

-- Read fields of a job that must be a hash to matter (active or finished: the
-- fenced transitions, recovery, retention). nil when the key is missing or holds
-- another type: a read never aborts a script.
local function read_hash(q, id, ...)
  local r = rpcall('HMGET', k_job(q, id), ...)
  if type(r) ~= 'table' or r.err or not r[1] then return nil end
  return r
end

-- Waiting entries (memory: see keys.py). A job enqueued waiting (or a scheduled job
-- string once due) has no key of its own: its level list holds its entry
--   <id>|<order>|<enqueued_at>|<run_at>|<body>
-- (run_at empty unless it was scheduled: its due time) and the queue's index holds
-- id -> '<order>' ('<order>|<prio>' off level 0) in its bucket, a hash small enough that Redis keeps it a listpack. An
-- entry is live while the index holds its order and level: an entry of a job that left
-- (claimed, cancelled, removed, parked) or of an earlier job under a re-used id is not,
-- and is skipped and dropped where it is popped, with no stale count. A job id holds no
-- '|': an entry without one is a bare id (previous layouts, and every job that has a key
-- of its own: claimed once, of a flow, parked), whose job is its key.
local function idx_val(o, prio)
  o = int_text(o)
  if not prio or prio == '0' then return o end
  return o .. '|' .. prio
end

-- A waiting job's order and priority from the index (nil: not an entry job).
local function idx_of(q, id)
  local v = rcall('HGET', k_idx(q, id), id)
  if not v then return nil end
  local o, p = string.match(v, '^(%d+)|?(%-?%d*)$')
  if not o then return nil end
  if p == '' then p = '0' end
  return o, p
end

local function pack_entry(id, o, e, m, r)
  return id .. '|' .. int_text(o) .. '|' .. int_text(e) .. '|' .. (r and int_text(r) or '')
    .. '|' .. m
end

-- A waiting entry's id, order, enqueued_at, run_at (false: none) and body, as values (no
-- table: claim.lua's activate, once per claimed job); nil for a bare id, a removed
-- entry's '|' or other bytes.
local function entry_parts(v)
  local id, o, e, r, at = string.match(v, '^([^|]+)|(%d+)|(%d+)|(%d*)|()')
  if not id then return nil end
  return id, o, e, r ~= '' and r or false, string.sub(v, at)
end

-- A waiting entry's fields; nil for a bare id, a removed entry's '|' or other bytes.
local function parse_entry(v)
  local id, o, e, r, m = entry_parts(v)
  if not id then return nil end
  return {id = id, o = o, e = e, r = r, m = m}
end

local function is_bare(v) return not string.find(v, '|', 1, true) end

-- Is entry `f` (parse_entry) of level `prio` of queue `q` its job's live entry? Keeps
-- its index bucket's name in f.ik (one SHA1 per entry).
local function entry_live(q, prio, f)
  f.ik = k_idx(q, f.id)
  return rcall('HGET', f.ik, f.id) == idx_val(f.o, prio)
end

-- Store a waiting job as its entry (the tail of its level; LPUSH, like push_waiting).
-- A level's score in the queue's levels zset (its priority negated), as text.
local function level_score(prio)
  if prio == '0' then return '0' end
  local minus, digits = string.match(prio, '^(%-?)(%d+)$')
  if not digits then return -tonumber(prio) end  -- not plain digits: '+5', '0x10', ...
  if minus == '-' then return digits end
  return '-' .. digits
end

local function push_entry(q, prio, id, o, e, m, r)
  rcall('HSET', k_idx(q, id), id, idx_val(o, prio))
  rcall('LPUSH', k_wait(q, prio), pack_entry(id, o, e, m, r))
  rcall('ZADD', k_levels(q), level_score(prio), prio)
end

-- Push packed waiting entries (enqueue.lua) onto level `prio`'s list `lk` of queue `q`,
-- 500 per LPUSH, and mark the level non-empty.
local function push_entries(q, prio, lk, entries)
  for s = 1, #entries, 500 do
    rcall('LPUSH', lk, unpack(entries, s, math.min(s + 499, #entries)))
  end
  rcall('ZADD', k_levels(q), level_score(prio), prio)
end

-- When a job enqueued at `now` with `eta` and `delay` (ARGV text, µs) is due: its eta
-- when set, else now + delay when positive, else 0 (at once). A '0' is taken as it is:
-- most jobs have eta and delay 0, and every tonumber of a string is a strtod.
local function run_at_of(eta, delay, now)
  if eta ~= '0' and tonumber(eta) > 0 then return tonumber(eta) end
  if delay ~= '0' and tonumber(delay) > 0 then return now + tonumber(delay) end
  return 0
end

-- The refusal of an enqueue that would take queue `q` past `limit` waiting and
-- scheduled jobs with `extra` more (nil: room enough).
local function queue_full(q, extra, limit)
  local c = rcall('HMGET', k_counts(q), 'w', 's')
  local pending = (tonumber(c[1]) or 0) + (tonumber(c[2]) or 0)
  if pending + extra > limit then
    return redis.error_reply(string.format('TYPEDQ_QUEUE_FULL %s %d %d %d', q, pending, extra,
      limit))
  end
  return nil
end

local function entry_order(v) return tonumber(string.match(v, '^[^|]+|(%d+)|')) end

-- LRANGE of list `lk` (`n` entries) from index a to b, counted from the end nearer to
-- them (Redis walks a long list's nodes from the end an index is counted from).
local function lrange_near(lk, n, a, b)
  if b >= n then b = n - 1 end
  if a > n / 2 then return rcall('LRANGE', lk, a - n, b - n) end
  return rcall('LRANGE', lk, a, b)
end

-- Where the entry of job `id` (order `o`) is in its level list: its index and bytes
-- (nil: not there). Entries are pushed in order at the tail, so their orders fall from
-- index 0 to the head, and are usually dense (one INCRBY per enqueue): a first guess
-- interpolates between the tail's and the head's order and looks at the 65 entries
-- around it (a probe in a long list costs a walk over its nodes, ~0.1 ms at 1,000,000
-- entries); else a binary search (LRANGE of a few entries per step, skipping bare ids)
-- narrows it to 64 entries, O(log n) probes; a list out of order (hand-backs put
-- entries at the head) falls back to a scan in chunks, O(n).
local function find_entry(q, prio, o, id)
  local lk = k_wait(q, prio)
  local want, prefix = tonumber(o), id .. '|' .. o .. '|'
  local n = rcall('LLEN', lk)
  if n == 0 then return nil end
  local ot = entry_order(rcall('LINDEX', lk, 0))
  local oh = entry_order(rcall('LINDEX', lk, -1))
  if ot and oh and ot > oh and want <= ot and want >= oh then
    local guess = math.floor((ot - want) / (ot - oh) * (n - 1))
    local from = math.max(0, guess - 32)
    for j, v in ipairs(lrange_near(lk, n, from, guess + 32)) do
      if string.sub(v, 1, #prefix) == prefix then return from + j - 1, v end
    end
  end
  local lo, hi = 0, n - 1
  while hi - lo > 64 do
    local mid = math.floor((lo + hi) / 2)
    local eo, at = nil, mid
    for j, v in ipairs(lrange_near(lk, n, mid, mid + 7)) do
      eo = entry_order(v)
      if eo then at = mid + j - 1; break end
    end
    if not eo then break end
    if eo > want then lo = mid else hi = at end
  end
  if hi - lo <= 64 then
    for j, v in ipairs(lrange_near(lk, n, lo, hi)) do
      if string.sub(v, 1, #prefix) == prefix then return lo + j - 1, v end
    end
  end
  for s = 0, n - 1, 1000 do
    for j, v in ipairs(lrange_near(lk, n, s, s + 999)) do
      if string.sub(v, 1, #prefix) == prefix then return s + j - 1, v end
    end
  end
  return nil
end

-- A waiting entry job leaves its entry (claimed away from the list, cancelled,
-- removed, parked): its index entry goes, and its list entry, when found, becomes '|'
-- (a few bytes until a claim or purge pops it). Returns the entry's fields (nil: none).
local function take_entry(q, id, o, prio)
  local pos, v = find_entry(q, prio, o, id)
  rcall('HDEL', k_idx(q, id), id)
  if not pos then return nil end
  rcall('LSET', k_wait(q, prio), pos, '|')
  return parse_entry(v)
end

-- Does job `id` exist in queue `q` (a key of its own, or a waiting entry)?
local function job_exists(q, id)
  return rcall('EXISTS', k_job(q, id)) == 1
    or rcall('HEXISTS', k_idx(q, id), id) == 1
end

-- Read fields of a job that has a key of its own (hash or job string; absent fields
-- read as false, like HMGET's): what a bare list entry names. nil when there is no key
-- or bytes typedq did not write; the key's type second.
local function read_keyed(q, id, ...)
  local jk = k_job(q, id)
  local ty = rcall('TYPE', jk).ok
  if ty == 'hash' then
    local r = rcall('HMGET', jk, ...)
    if not r[1] then return nil, ty end
    return r, ty
  elseif ty == 'string' then
    local f = parse_rec(rcall('GET', jk), q)
    if not f then return nil, ty end
    local names, out = {...}, {}
    for i = 1, #names do out[i] = f[names[i]] or false end
    return out, ty
  end
  return nil, ty
end

-- Read fields of a job in any state: a hash, a job string or a waiting entry (its
-- absent fields read as false, like HMGET's). nil when there is no job or bytes typedq
-- did not write. An entry job's e, r and m are in its list entry: found by find_entry
-- only when asked for.
local function read_job(q, id, ...)
  local r, ty = read_keyed(q, id, ...)
  if ty ~= 'none' then return r end
  local o, p = idx_of(q, id)
  if not o then return nil end
  local f = {s = 'w', q = q, o = o, p = p ~= '0' and p, e = false, r = false, m = false}
  local names, out = {...}, {}
  for i = 1, #names do
    local name = names[i]
    if (name == 'e' or name == 'm' or name == 'r') and not f.e then
      local _, v = find_entry(q, p, o, id)
      local g = v and parse_entry(v)
      if g then f.e, f.r, f.m = g.e, g.r, g.m end
    end
    out[i] = f[name] or false
  end
  return out
end

-- Before a job's fields change: a job string or waiting entry becomes the job hash
-- (no-op for a hash).
local function to_hash(q, id)
  local jk = k_job(q, id)
  local ty = rcall('TYPE', jk).ok
  if ty == 'none' then
    local o, p = idx_of(q, id)
    if not o then return end
    local g = take_entry(q, id, o, p) or {e = '0', m = ''}
    local f = {s = 'w', q = q, o = o, e = g.e, p = p ~= '0' and p, r = false, m = g.m}
    rcall('HSET', jk, unpack(rec_fields(f)))
    return
  end
  if ty ~= 'string' then return end
  local f = parse_rec(rcall('GET', jk), q)
  if not f then return end
  rcall('DEL', jk)
  rcall('HSET', jk, unpack(rec_fields(f)))
end

-- A stored priority that is not an integer (garbage) counts as 0.
local function sane_prio(p)
  if p and is_int(p) then return p end
  return '0'
end

-- Per-queue count deltas, written once at the end of a script.
local deltas = {}
local function count(q, state, d)
  local m = deltas[q]
  if not m then m = {}; deltas[q] = m end
  m[state] = (m[state] or 0) + d
end
-- Per-queue rollup deltas (completed/failed/retried), written once per queue at the end
-- of a script, like the count deltas.
local rollups = {}
local minute_text = {}  --@keep
local function roll(q, field)
  local m = rollups[q]
  if not m then m = {}; rollups[q] = m end
  m[field] = (m[field] or 0) + 1
end
local function flush_rollups()
  if next(rollups) == nil then return end
  -- The minute of the script's own clock reading (one TIME call fewer per script), as
  -- text made once per minute (kept across calls: a number's text, nothing else).
  local n = math.floor((last_now or now_us()) / 60000000)
  if minute_text.n ~= n then minute_text.n, minute_text.t = n, string.format('%d', n) end
  local minute = minute_text.t
  for q, m in pairs(rollups) do
    local hk = k_minute(q, minute)
    local fresh = false
    -- A counter that equals its delta was just made (counters only grow): the hash may
    -- be new, so it gets its TTL. Every hash is made with one of its counters, and the
    -- minute's writes all fall within that minute: one EXPIRE per counter and minute
    -- instead of one per call (the TTL counts from the first write, not the last).
    for f, d in pairs(m) do
      if rcall('HINCRBY', hk, f, num_text(d)) == d then fresh = true end
    end
    if fresh then rcall('EXPIRE', hk, ROLLUP_TTL_S) end
  end
  rollups = {}
end
-- A batch of completions (complete_one) writes the active and done sorted sets once per
-- key, at the end (flush_zsets), instead of one ZREM and one ZADD per job: a command
-- costs a script more than the members it adds. Nothing a completion runs reads these
-- sets; trim and flush_counts write them first. zbatch (batch_zsets(true), by a script
-- that completes more than one job, for the rest of its call): complete_one and finalize
-- defer, into active_rems (active set key -> ids) and done_adds (done set key -> score,
-- id, score, id, ...). Made per call only when used: a one-job call pays nothing.
local zbatch, active_rems, done_adds
local function batch_zsets(on)
  zbatch = on
  if on and not active_rems then active_rems, done_adds = {}, {} end
end
local function flush_zsets()
  if not zbatch then return end
  for key, ids in pairs(active_rems) do
    for s = 1, #ids, 500 do rcall('ZREM', key, unpack(ids, s, math.min(s + 499, #ids))) end
  end
  for key, m in pairs(done_adds) do
    for s = 1, #m, 1000 do rcall('ZADD', key, unpack(m, s, math.min(s + 999, #m))) end
  end
  active_rems, done_adds = {}, {}
end
local function flush_counts()
  flush_zsets()
  flush_rollups()
  for q, m in pairs(deltas) do
    for s, d in pairs(m) do
      -- Never below zero, even after bytes that typedq did not write were dropped.
      if d ~= 0 and rcall('HINCRBY', k_counts(q), s, num_text(d)) < 0 then
        rcall('HSET', k_counts(q), s, '0')
      end
    end
  end
end

local function push_waiting(q, prio, id, at_head)
  local lk = k_wait(q, prio)
  if at_head then rcall('RPUSH', lk, id) else rcall('LPUSH', lk, id) end
  rcall('ZADD', k_levels(q), level_score(prio), prio)
end

-- How many entries at the head of a level list a hand-back looks at to find its
-- jobs' old places (bounded work; past it they go behind the entries looked at).
local PLACE_SCAN = 64

-- Jobs handed back with their old place (release, stall recovery): each goes back
-- among the waiting jobs of its level by its enqueue order `o`, as if it had never
-- left, also when jobs come back one call at a time. Handed-back jobs are usually
-- older than every waiting job, so their place is at or near the head: the script
-- pops at most PLACE_SCAN head entries, merges the jobs in by order and pushes the
-- lot back. Entries that are not live here (stale or dead) stay in front of the
-- live ones, in their own order, so a stale entry still precedes its id's live one;
-- a waiting entry that is not live is dropped (it has no stale count to consume).
-- back: {id, queue, prio, order} per job.
local function push_back_in_order(back)
  local levels = {}
  for _, b in ipairs(back) do
    local lk = k_wait(b[2], b[3])
    local g = levels[lk]
    if not g then
      g = {q = b[2], prio = b[3], items = {}}
      levels[lk] = g
    end
    g.items[#g.items + 1] = {b[1], b[4], false}
  end
  for lk, g in pairs(levels) do
    local dead, live = {}, g.items
    local popped = rcall('RPOP', lk, PLACE_SCAN)
    if popped then
      local sk = k_stale(g.q)
      local has_stale = rcall('EXISTS', sk) == 1
      local seen = {}
      for _, id in ipairs(popped) do
        if not is_bare(id) then
          local f = parse_entry(id)
          if f and entry_live(g.q, g.prio, f) then live[#live + 1] = {id, tonumber(f.o), true} end
        else
          local stale = 0
          if has_stale then stale = tonumber(rcall('HGET', sk, g.prio .. '|' .. id)) or 0 end
          seen[id] = (seen[id] or 0) + 1
          local r = read_keyed(g.q, id, 's', 'q', 'p', 'o')
          if seen[id] <= stale or not r or r[1] ~= 'w' or (r[2] and r[2] ~= g.q)
              or sane_prio(r[3]) ~= g.prio then
            dead[#dead + 1] = id
          else
            live[#live + 1] = {id, tonumber(r[4]) or 0, true}
          end
        end
      end
    end
    -- Oldest first; on equal order (garbage), entries that were in the list first.
    table.sort(live, function(x, y)
      if x[2] ~= y[2] then return x[2] < y[2] end
      return x[3] and not y[3]
    end)
    -- RPUSH adds at the head: push the newest first, so the oldest ends up first out;
    -- the dead entries go last (first out), in the order they were popped.
    for i = #live, 1, -1 do rcall('RPUSH', lk, live[i][1]) end
    for i = #dead, 1, -1 do rcall('RPUSH', lk, dead[i]) end
    rcall('ZADD', k_levels(g.q), -tonumber(g.prio), g.prio)
  end
end

-- The answer of a fenced finish for a job that has no job hash: a job that exists but
-- was never claimed (still a job string) is not ours to finish (LEASE_LOST, as for
-- any job that is not active under the token); no job at all is NOT_FOUND.
local function not_active_answer(q, id)
  if job_exists(q, id) then return 2 end
  return 3
end

-- A FailureRecord (typedq.errors) as msgpack: a map with the struct's field names.
-- The same records and messages as typedq/broker/records.py builds for the memory
-- broker (tests/test_failure_records.py holds the two to the same fields).
local function failure_record(reason, error_type, message, attempt, worker, now)
  local rec = {
    reason = reason, error_type = error_type, message = message,
    attempt = attempt, retryable = false, failed_at = now / 1000000,
  }
  if worker then rec.worker_id = worker end
  return cmsgpack.pack(rec)
end

-- Retention: drop the oldest finished jobs of one state of queue `q` while there are
-- more than `cap` or they are older than `ttl`; at most `budget` per call (bounded work).
local function trim(q, state, now, ttl, cap, budget)
  flush_zsets()
  local zkey = k_done(q, state)
  local over = rcall('ZCARD', zkey) - cap
  local expired = rcall('ZCOUNT', zkey, '-inf', '(' .. string.format('%d', now - ttl))
  local n = math.max(over, expired)
  if n <= 0 then return 0 end
  if n > budget then n = budget end
  local popped = rcall('ZPOPMIN', zkey, n)
  for i = 1, #popped, 2 do
    local r = read_hash(q, popped[i], 's')
    if r and r[1] == state then
      rcall('DEL', k_job(q, popped[i]))
      count(q, state, -1)
      count(q, 't' .. state, 1)  -- trimmed by retention (queue_stats' trimmed counts)
    end
  end
  return n
end

local done_ids = {}
local work_queues = {}
local function note_done(q, id) done_ids[#done_ids + 1] = id end
local function publish_cancel(q, id) rcall('PUBLISH', CH_CANCEL, id) end
-- The work notice names only the queues whose waiter mark this call consumed: a
-- worker waits for work only after a claim that came up short, and that claim set the
-- mark in the same script that found nothing more to claim, so any later call giving
-- the queue work finds the mark (no lost wake-up). One notice wakes every waiter of the
-- queue (broadcast); calls after it publish nothing until a claim comes up short again.
local function publish()
  if #done_ids > 0 then rcall('PUBLISH', CH_DONE, table.concat(done_ids, ' ')) end
  if next(work_queues) == nil then return end  -- (no table for a call that woke nothing)
  local qs = nil
  for q in pairs(work_queues) do
    if rcall('DEL', k_waiter(q)) == 1 then
      qs = qs or {}
      qs[#qs + 1] = q
    end
  end
  if qs then rcall('PUBLISH', CH_WORK, table.concat(qs, ' ')) end
end
-- The waiter marks of the queues args[first .. last] (a claim that came up short: see
-- publish and claim.lua).
local function mark_waiters(args, first, last)
  for i = first, last do rcall('SET', k_waiter(args[i]), '1') end
end

-- The bookkeeping of job `id` of queue `q` that a claim took (claim.lua's activate, the
-- same for a waiting entry as for a job with a key): its lease until `lease_until` (text)
-- queued in `leases` (queue -> lease_until, id, ...: one ZADD per queue at the end of a
-- claim of several jobs) or added now (nil: a claim of one), waiting -1 / active +1, and
-- its claim record line '<queue>|<id>', appended to `lines` (nil: a claim of one, which
-- keeps the line itself, no table) and returned.
local function claimed_job(q, id, lease_until, leases, lines)
  if leases then
    local m = leases[q]
    if not m then m = {}; leases[q] = m end
    m[#m + 1], m[#m + 2] = lease_until, id
  else
    rcall('ZADD', k_active(q), lease_until, id)
  end
  count(q, 'w', -1)
  count(q, 'a', 1)
  local line = q .. '|' .. id
  if lines then lines[#lines + 1] = line end
  return line
end
--@sharded

-- A job of a workflow settled: hand off or end the flow (defined with the workflow
-- helpers at the end of this file).
local flow_settle
-- Per job key, its flow link {fl, fm, fs, fq} or false, when the script already read
-- it (complete and fail do, with the fields they read anyway): finalize then needs no
-- read of its own; true: a job of a flow whose link finalize reads with its outcome
-- (complete reads only 'fl', so a job of no flow pays no lookup of absent fields). `fq`
-- is the queue of the flow's own job (where the flow record is; absent on jobs of the
-- previous layout: the job's own queue).
local flow_links = {}
local function flow_link_of(q, id, fl, fm, fs, fq)
  if fl then flow_links[k_job(q, id)] = {fl, fm, fs, fq or q} else flow_links[k_job(q, id)] = false end
end

-- Move an active/waiting/scheduled job to a final state. A workflow's job (fields
-- fl/fm/fs, see typedq/broker/flow.py) hands off to the rest of its flow here, in the
-- same script as its own transition.
-- The task name at the head of a job body ([task, payload, ...], msgpack): a fixstr or
-- str8 right after the array header; '' for anything else (a pre-body record).
local function body_task(m)
  if not m then return '' end
  local b = string.byte(m, 2)
  if b and b >= 0xa0 and b <= 0xbf then return string.sub(m, 3, 2 + b - 0xa0) end
  if b == 0xd9 then return string.sub(m, 4, 3 + (string.byte(m, 3) or 0)) end
  return ''
end

-- Job `id` of queue `q` reached final state `state`: when the queue's event stream is
-- on, add its event '<n>-1' (n: the queue's next event number), capped near its 'cap'.
-- One HGET per queue per call when it is off.
local events_cap = {}
local function emit_event(id, q, state)
  local cap = events_cap[q]
  if cap == nil then
    cap = tonumber(rcall('HGET', k_events_cfg(q), 'cap')) or false
    events_cap[q] = cap
  end
  if not cap then return end
  local r = rcall('HMGET', k_job(q, id), 'm', 'res', 'err', 'a')
  local data = r[3]
  if state == 'c' then data = r[2] end
  local n = rcall('HINCRBY', k_events_cfg(q), 'n', 1)
  -- pcall: an entry id at or below the stream's last (its config was deleted and made
  -- again) loses that event rather than aborting the transition half done.
  rpcall('XADD', k_events(q), 'MAXLEN', '~', cap, n .. '-1', 'i', id, 'k',
    body_task(r[1]), 's', state, 'd', data or '', 'a', r[4] or '0')
end

-- The rest of a job's move to a final state, once its hash holds the state (finalize,
-- complete_one): into the done set (`at`: the finish time's text), counts, rollup,
-- wake-up, event, its flow. `fl`: what the script knows of its flow link (as
-- flow_links holds it; nil: not read yet).
local function finalize_after(id, q, jk, from, state, now, at, fl)
  local done_key = k_done(q, state)
  if zbatch then
    local m = done_adds[done_key]
    if not m then m = {}; done_adds[done_key] = m end
    m[#m + 1], m[#m + 2] = at, id
  else
    rcall('ZADD', done_key, at, id)
  end
  count(q, from, -1)
  count(q, state, 1)
  if state == 'c' or state == 'f' then roll(q, state) end
  note_done(q, id)
  emit_event(id, q, state)
  if fl == true then
    -- A job of a flow whose link was not read yet (complete_one): link and outcome in
    -- one read.
    local r = rcall('HMGET', jk, 'fl', 'fm', 'fs', 'fq', 'res', 'err')
    if r[1] then flow_settle(r[4] or q, r[1], r[2], r[3], state, r[5], r[6], now, q, id) end
    return
  end
  if fl == nil then
    fl = rcall('HMGET', jk, 'fl', 'fm', 'fs', 'fq')
    if not fl[1] then fl = false elseif not fl[4] then fl[4] = q end
  end
  if fl then
    local out = rcall('HMGET', jk, 'res', 'err')
    flow_settle(fl[4], fl[1], fl[2], fl[3], state, out[1], out[2], now, q, id)
  end
end

-- `extra`: more field/value pairs to write with the state (one HSET instead of two);
-- when they set the token 't' (to ''), no HDEL of it follows.
local function finalize(id, q, from, state, now, extra)
  local jk = k_job(q, id)
  local at = num_text(now)
  if extra then
    rcall('HSET', jk, 's', state, 'fa', at, unpack(extra))
  else
    rcall('HSET', jk, 's', state, 'fa', at)
  end
  if not extra or extra[#extra - 1] ~= 't' then rcall('HDEL', jk, 't') end
  finalize_after(id, q, jk, from, state, now, at, flow_links[jk])
end

-- Release the concurrency slot `slot` (the job hash's 'ck', nil: none) that job `id`
-- of queue `q` holds, and open the gate of that key so parked jobs are claimed again.
-- Every way out of 'active' calls it (complete, fail, release, recovery, remove, purge).
local function free_slot(id, q, slot)
  if not slot then return end
  rcall('SREM', k_slots(q, slot), id)
  rcall('HDEL', k_job(q, id), 'ck')
  local gk, gate = k_gates(q), 'c|' .. slot
  local s = rcall('ZSCORE', gk, gate)
  if s and tonumber(s) ~= 0 then
    rcall('ZADD', gk, 0, gate)
    work_queues[q] = true
  end
end

-- The concurrency slot `slot` of an active job `id` that an operator deletes (remove,
-- purge) while its handler may still run: the job's place in the slot set goes to a
-- ghost '~<id>' until the job's lease would have ended (`until_us`: by then its worker,
-- told the lease is lost, has cancelled the handler), and the slot's gate opens then.
-- Ghosts are in the zset '<slot set>:g' by when they end; the claim's count of the slot
-- drops ended ones (claim.lua's held). A lease already over frees the slot at once.
local function ghost_slot(id, q, slot, until_us)
  if not slot then return end
  local ends = tonumber(until_us)
  if not ends or ends <= now_us() then return free_slot(id, q, slot) end
  local sk = k_slots(q, slot)
  rcall('SREM', sk, id)
  rcall('SADD', sk, '~' .. id)
  rcall('ZADD', sk .. ':g', until_us, '~' .. id)
  local gk, gate = k_gates(q), 'c|' .. slot
  local s = rcall('ZSCORE', gk, gate)
  if s and tonumber(s) > ends then rcall('ZADD', gk, until_us, gate) end
end

-- Complete job `id` of queue `q` under token `tok` with result `res`, fenced (complete.lua,
-- and a claim that settles its worker's completions first). The outcome: 0 OK,
-- 1 ALREADY_FINISHED (same token: a re-sent request), 2 LEASE_LOST, 3 NOT_FOUND.
local function complete_one(q, id, tok, res, now)
  -- A workflow's other fields (fm, fs, fq) are read only for a job of a flow ('fl'): a
  -- field a hash does not hold costs HMGET a scan of the whole hash. So is the done
  -- token 'd' (absent on an active job), read below only when the job is not ours.
  local r = read_hash(q, id, 's', 't', 'ck', 'fl')
  if not r then return not_active_answer(q, id) end
  if r[1] == 'a' and r[2] == tok then
    local ak = k_active(q)
    if zbatch then
      local ids = active_rems[ak]
      if not ids then ids = {}; active_rems[ak] = ids end
      ids[#ids + 1] = id
    else
      rcall('ZREM', ak, id)
    end
    if r[3] then free_slot(id, q, r[3]) end
    -- finalize's work, without its table of extra fields: the result and the token go
    -- in the state's HSET, and the token is cleared there too (every reader of 't'
    -- checks the state 'a' first): one HDEL fewer per job.
    local jk, at = k_job(q, id), num_text(now)
    rcall('HSET', jk, 's', 'c', 'fa', at, 'res', res, 'd', tok, 't', '')
    -- (true: a job of a flow whose link finalize_after reads, with the result it reads
    -- anyway)
    finalize_after(id, q, jk, 'a', 'c', now, at, r[4] and true or false)
    return 0
  end
  -- Not active under this token: finished under it already (a re-sent request: its done
  -- token) or not ours (the lease was lost).
  if rcall('HGET', k_job(q, id), 'd') == tok then return 1 end
  return 2
end

-- Milliseconds a request record (a claim's jobs, an enqueue's or a cancel's answer)
-- is kept: longer than redis-py's whole retry window, so a re-sent script (lost
-- reply, automatic retry) finds the first copy's answer and returns it.
local REQ_TTL_MS = '60000'

-- Stale waiting entries. A waiting job that leaves its level list without being
-- popped (cancel, remove) leaves its entry behind (O(1) instead of an O(n) LREM);
-- the entry is counted in the queue's stale hash under '<prio>|<id>'. Stale entries
-- of one id in one level always precede its live entry (a job gets a new entry only
-- while it has none live), so whoever pops an entry with a count consumes one and
-- skips it: a re-used id is claimed where a fresh job would be, never earlier.
-- Per queue: does its stale hash exist (nil: not looked yet)? Most queues have no
-- stale entries at all; then a claim pays one EXISTS, not one HGET per job.
local stale_any = {}
local function mark_stale(q, prio, id)
  rcall('HINCRBY', k_stale(q), prio .. '|' .. id, 1)
  rcall('HDEL', k_parked(q), id)  -- a parked job's gate entry is stale from now on
  stale_any[q] = true
end

local function take_stale(q, prio, id)
  local sk, field = k_stale(q), prio .. '|' .. id
  if stale_any[q] == nil then stale_any[q] = rcall('EXISTS', sk) == 1 end
  if not stale_any[q] then return false end
  local c = tonumber(rcall('HGET', sk, field))
  if not c then return false end
  if c <= 1 then rcall('HDEL', sk, field) else rcall('HINCRBY', sk, field, -1) end
  return true
end

-- Workflows (typedq/broker/flow.py). A flow F keeps, while it runs, the hash f:<F> on
-- the queue of its own job (`fq`): S steps, n members, c members not settled, col '1'
-- when the last step is a collector, pol 'c' for the collecting fan-in, mq/sq the
-- members' and steps' queues (space-separated, or one name when all share it); per
-- member i: r<i> once it settled (its fan-in element); fi/fst/fe: the first failed
-- member (index, state, record). Member i is the job F.m<i>, step k is F.<k>, the last
-- step is F itself. A held step is scheduled at HELD_US with its body split around the
-- payload (mh, mt). Every job of a flow holds fl (F) and fq.
local HELD_US = 9000000000000000
local FLOW_BROKEN = 'a job of this flow was removed before it finished'
local function flow_step_id(f, k, steps)
  if k == steps - 1 then return f end
  return f .. '.' .. k
end

-- The queues of a flow record's 'mq'/'sq' list as a table (entry i+1 for index i),
-- `count` entries; every entry `fq` when the list is absent, the one name when it
-- holds one.
local function flow_queues(list, count, fq)
  local t = {}
  if list and list ~= '' then
    for name in string.gmatch(list, '[^ ]+') do t[#t + 1] = name end
  end
  local fill = fq
  if #t == 1 then fill = t[1] end
  if #t ~= count then
    t = {}
    for i = 1, count do t[i] = fill end
  end
  return t
end

-- The space-separated list of queues as a flow record stores it (one name when equal).
local function flow_queue_list(queues)
  if #queues == 0 then return '' end
  local same = true
  for i = 2, #queues do if queues[i] ~= queues[1] then same = false; break end end
  if same then return queues[1] end
  return table.concat(queues, ' ')
end

local function be_bytes(n, width)
  local t = {}
  for i = width, 1, -1 do
    t[i] = string.char(n % 256)
    n = math.floor(n / 256)
  end
  return table.concat(t)
end

local function msgpack_bin(s)
  local n = #s
  if n < 256 then return '\196' .. string.char(n) .. s end
  if n < 65536 then return '\197' .. be_bytes(n, 2) .. s end
  return '\198' .. be_bytes(n, 4) .. s
end

local function msgpack_str(s)
  local n = #s
  if n < 32 then return string.char(160 + n) .. s end
  if n < 256 then return '\217' .. string.char(n) .. s end
  if n < 65536 then return '\218' .. be_bytes(n, 2) .. s end
  return '\219' .. be_bytes(n, 4) .. s
end

-- Fan-out members' process spans (typedq.tracing): a traced member's completion or
-- failure names its span (a W3C traceparent) in an optional last section of its script's
-- arguments, nl then nl x (id, traceparent): read_span_links(ARGV, at) (false when ARGV does
-- not end with one). flow_settle keeps the first MAX_SPAN_LINKS members' in the flow
-- record (l<i>, and L once any); the fan-in gives them to the callback (flow_release).
local MAX_SPAN_LINKS = 128
local span_links = {}
-- (The script passes its ARGV: a helper of the function library sees no call's ARGV.)
local function read_span_links(argv, at)
  local nl = tonumber(argv[at])
  if not is_int(nl) or nl < 1 or #argv ~= at + 2 * nl then return false end
  for i = 0, nl - 1 do span_links[argv[at + 1 + 2 * i]] = argv[at + 2 + 2 * i] end
  return true
end

local function msgpack_array_header(n)
  if n < 16 then return string.char(144 + n) end
  if n < 65536 then return '\220' .. be_bytes(n, 2) end
  return '\221' .. be_bytes(n, 4)
end

-- Flows across slots (Redis Cluster). A flow whose jobs are on queues of several slots
-- holds fx '1' on its jobs and x '1' on its record. A script works on one slot: in such
-- a flow, a hand-off to a job on another queue than the script's own (`home`) is not
-- done there but written to the home queue's outbox (Q ho: entry id -> written at, µs;
-- Q ho:<entry id>: '<target queue>|<record>', the record a cmsgpack array) in the same
-- atomic script, and named in the script's reply (flow_reply); the client applies it
-- on the target's slot (flow_apply.lua), then deletes it (flow_ack.lua). The reaper
-- pass (recover.lua) hands back the entries left behind (a worker died in between), so
-- every entry is applied at least once; an apply takes effect only while its target
-- job or record is still in the state it expects, so applying one twice changes
-- nothing. Two queues of such a flow that share a slot by chance still go through the
-- outbox. Records: {'m', F, fq, i, state, res, err} member i settled (applied at the
-- root, fq); {'e', F, fq, state, err} end the flow (at the root); {'r', F, fq, k, S,
-- collector, payload} release step k; {'E', F, fq, state, err, ids...} end the flow's
-- jobs on the target queue; {'a', F, fq, n, ids...} start the flow's jobs on the target
-- queue (the first n move to waiting, the rest stay held), stored pending by
-- flow_part.lua; {'D', F, fq, ids...} drop pending jobs of a flow its root refused.
local flow_handoffs = {}  -- the entries this script wrote: {home, entry id, target, record}
local flow_ended = {}     -- flows this script ended: the settles of their jobs stay quiet
local function k_outbox(q) return k_q(q) .. 'ho' end
local function k_handoff(q, eid) return k_q(q) .. 'ho:' .. eid end
local function flow_outbox(home, target, eid, rec)
  local packed = cmsgpack.pack(rec)
  rcall('ZADD', k_outbox(home), last_now or now_us(), eid)
  rcall('SET', k_handoff(home, eid), target .. '|' .. packed)
  flow_handoffs[#flow_handoffs + 1] = {home, eid, target, packed}
end
-- A script's reply with the hand-offs it wrote (or handed back): {'TYPEDQ_HANDOFF',
-- reply, then per entry home, id, target, record}; the reply itself when there are none.
local function flow_reply(r)
  if #flow_handoffs == 0 then return r end
  local t = {'TYPEDQ_HANDOFF', r}
  for _, h in ipairs(flow_handoffs) do
    t[#t + 1] = h[1]; t[#t + 1] = h[2]; t[#t + 1] = h[3]; t[#t + 1] = h[4]
  end
  return t
end

-- The answer of a claim with a settle section (claim.lua): the claim's answer and the
-- completions' outcomes, once the completions' counts are written and announced.
local function settle_answer(out, settled)
  flush_counts()
  publish()
  return flow_reply({out, settled})
end

-- The reaper: hand back up to `limit` entries of queue q's outbox written `age` µs or
-- more ago (their writer died before it applied them, or its apply failed).
local function flow_outbox_due(q, now, age, limit)
  local ids = rcall('ZRANGEBYSCORE', k_outbox(q), '-inf', string.format('%d', now - age),
    'LIMIT', 0, limit)
  for _, eid in ipairs(ids) do
    local v = rcall('GET', k_handoff(q, eid))
    local target, packed = nil, nil
    if v then target, packed = string.match(v, '^([^|]+)|(.*)$') end
    if target then
      flow_handoffs[#flow_handoffs + 1] = {q, eid, target, packed}
    else
      rcall('ZREM', k_outbox(q), eid)
    end
  end
end

-- A purge of queue q under way in this call (purge.lua sets it): {q = queue, n = jobs
-- it deleted through purge_takes, states = the letters of every state it deletes}. nil
-- in every other call.
local purging
-- A job of the flow a purge's deletion ends (or releases) is itself waiting or
-- scheduled on the purged queue in a purged state: the purge deletes it rather than end
-- it, as it would have had it come first (the embedded broker deletes all of them
-- before any flow reacts), so the outcome and the count do not depend on the order or
-- the batch the jobs fall in. True when it was deleted (the caller took its sorted-set
-- entry, or marked its waiting entry stale, already).
local function purge_takes(q, id, s)
  if not purging or purging.q ~= q or not purging.states[s] or (s ~= 's' and s ~= 'w') then
    return false
  end
  rcall('DEL', k_job(q, id))
  count(q, s, -1)
  note_done(q, id)
  purging.n = purging.n + 1
  return true
end

-- Job `id` of queue `q` ends with its flow (see flow_end).
local function flow_end_job(q, id, state, err, now)
  local r = read_hash(q, id, 's', 'q', 'p', 'a')
  if not r then return end
  local s = r[1]
  if s == 'a' then
    rcall('HSET', k_job(q, id), 'cr', 1)
    publish_cancel(q, id)
  elseif s == 'w' or s == 's' then
    if s == 'w' then mark_stale(q, sane_prio(r[3]), id) else rcall('ZREM', k_sched(q), id) end
    if purge_takes(q, id, s) then return end
    local st = 'x'
    local e = err
    if e then st = state else
      e = failure_record('cancelled', 'JobCancelled', 'cancelled with its flow',
        tonumber(r[4]) or 0, nil, now)
    end
    rcall('HSET', k_job(q, id), 'err', e)
    finalize(id, q, s, st, now)
  end
end

-- End a flow that did not complete: every job of it not final yet ends in `state`
-- with record `err` (nil: cancelled with the flow); a running one is asked to cancel.
-- In a flow across slots, the jobs on other queues than the root's end by one outbox
-- entry per queue.
local function flow_end(fq, f, state, err, now)
  local fk = k_flow(fq, f)
  local meta = rcall('HMGET', fk, 'S', 'n', 'mq', 'sq', 'x')
  if not meta[1] then return end
  rcall('DEL', fk)
  local steps, n = tonumber(meta[1]), tonumber(meta[2])
  local ids = {}
  local mq, sq = flow_queues(meta[3], n, fq), flow_queues(meta[4], steps, fq)
  for i = 0, n - 1 do ids[#ids + 1] = {f .. '.m' .. i, mq[i + 1]} end
  for k = 0, steps - 1 do ids[#ids + 1] = {flow_step_id(f, k, steps), sq[k + 1]} end
  local remote = {}
  for _, job in ipairs(ids) do
    local id, q = job[1], job[2]
    if meta[5] == '1' and q ~= fq then
      local rec = remote[q]
      if not rec then
        rec = {'E', f, fq, state, err or false}
        remote[q] = rec
      end
      rec[#rec + 1] = id
    else
      flow_end_job(q, id, state, err, now)
    end
  end
  for q, rec in pairs(remote) do flow_outbox(fq, q, f .. '|e|' .. q, rec) end
end

-- Give held step k (job `id` on queue q) its input: waiting now, or (a collector)
-- completed with it. In a flow across slots (`x`), a step that is no longer held was
-- released already (or ended with its flow): nothing to do; a missing one breaks the
-- flow, at its root (through the outbox when the root is not `home`). `links`: the
-- members' spans, for a fan-in callback (comma-separated traceparents).
local function flow_release_at(q, id, fq, f, k, steps, collector, payload, now, x, home, links)
  local jk = k_job(q, id)
  local r = read_hash(q, id, 's', 'q', 'mh', 'mt', 'p')
  if r and r[1] == 's' and purging and purging.q == q then
    rcall('ZREM', k_sched(q), id)
    if purge_takes(q, id, 's') then r = nil end
  end
  if not r or r[1] ~= 's' or not r[3] then
    if x and r then return false end
    local broken = failure_record('flow_broken', 'FlowBroken', FLOW_BROKEN, 0, nil, now)
    if x and fq ~= home then
      flow_outbox(home, fq, id .. '|b', {'e', f, fq, 'f', broken})
    else
      flow_end(fq, f, 'f', broken, now)
    end
    return false
  end
  rcall('ZREM', k_sched(q), id)
  if collector and k == steps - 1 then
    rcall('HDEL', jk, 'mh', 'mt', 'r')
    rcall('HSET', jk, 'res', payload)
    finalize(id, q, 's', 'c', now)
    return true
  end
  -- At the head of its priority level: a flow under way finishes before new work starts,
  -- instead of its next step or callback queueing behind the members of every flow
  -- enqueued since (O(1); the embedded broker does the same).
  rcall('HDEL', jk, 'mh', 'mt')
  local head, tail = r[3], r[4]
  -- A traced callback (its body has every field up to its trace context: 12) gets its
  -- members' span links as the body's 13th field, trace_links.
  if links and links ~= '' and string.byte(head, 1) == 156 then
    head, tail = '\157' .. string.sub(head, 2), tail .. msgpack_str(links)
  end
  -- Due from the hand-off (its queue wait does not include the steps before it).
  rcall('HSET', jk, 'm', head .. msgpack_bin(payload) .. tail, 's', 'w', 'r', now)
  push_waiting(q, sane_prio(r[5]), id, true)
  count(q, 's', -1)
  count(q, 'w', 1)
  work_queues[q] = true
  return true
end

-- Give held step k its input (flow_release_at). `sq`: the flow record's 'sq' (or a
-- step's 'fsq') when the caller read it already (nil: read here). `x`, `home`: a flow
-- across slots, run on `home`'s slot (nil: the root's): a step on another queue gets
-- its input through the outbox. `links`: see flow_release_at.
local function flow_release(fq, f, k, steps, collector, payload, now, sq, x, home, links)
  local id = flow_step_id(f, k, steps)
  if sq == nil then sq = rcall('HGET', k_flow(fq, f), 'sq') end
  local q = flow_queues(sq, steps, fq)[k + 1]
  home = home or fq
  if x and q ~= home then
    flow_outbox(home, q, id .. '|r',
      {'r', f, fq, k, steps, collector and '1' or '0', payload, links or false})
    return
  end
  flow_release_at(q, id, fq, f, k, steps, collector, payload, now, x, home, links)
end

-- Every member settled: fail the flow (a member failed, default policy) or release
-- step 0 with the msgpack array of the members' elements, in input order (one HMGET
-- per 1000 members).
local function flow_fan_in(fq, f, steps, n, collector, now)
  local fk = k_flow(fq, f)
  local names = {'fi', 'fst', 'fe', 'mq', 'sq', 'x', 'L'}
  local first = math.min(n, 1000)
  for i = 0, first - 1 do names[#names + 1] = 'r' .. i end
  local vals = rcall('HMGET', fk, unpack(names))
  if vals[1] then
    flow_end(fq, f, vals[2], vals[3], now)
    return
  end
  local parts = {msgpack_array_header(n)}
  for j = 8, #vals do parts[#parts + 1] = vals[j] or '\192' end
  for s = first, n - 1, 1000 do
    local more = {}
    for i = s, math.min(s + 999, n - 1) do more[#more + 1] = 'r' .. i end
    local got = rcall('HMGET', fk, unpack(more))
    for j = 1, #got do parts[#parts + 1] = got[j] or '\192' end
  end
  local links = nil
  if vals[7] then
    local ln = {}
    for i = 0, math.min(n, MAX_SPAN_LINKS) - 1 do ln[#ln + 1] = 'l' .. i end
    local t = {}
    for _, v in ipairs(rcall('HMGET', fk, unpack(ln))) do
      if v then t[#t + 1] = v end
    end
    links = table.concat(t, ',')
  end
  -- The payload carries the results now: the flow record keeps only its shape.
  rcall('DEL', fk)
  rcall('HSET', fk, 'S', steps, 'n', n, 'c', 0, 'col', collector and '1' or '0',
    'mq', vals[4] or '', 'sq', vals[5] or '')
  local x = vals[6] == '1'
  if x then rcall('HSET', fk, 'x', '1') end
  flow_release(fq, f, 0, steps, collector, table.concat(parts), now, vals[5] or false, x, nil,
    links)
end

-- A job of a flow across slots settled on queue q, not its flow's root: a member
-- reports to the root, a completed step releases the next one (here or through the
-- outbox), a step that failed or was cancelled ends the flow at the root. `ext`: the
-- job's fx, fS, fsq. (The last step is the flow's own job, always at the root.)
local function flow_settle_away(q, id, fq, f, fm, fs, state, res, err, now, ext)
  if fm then
    flow_outbox(q, fq, id .. '|m',
      {'m', f, fq, fm, state, res or false, err or false, span_links[id] or false})
  elseif state == 'c' then
    flow_release(fq, f, tonumber(fs) + 1, tonumber(ext[2]), false, res or '\192', now,
      ext[3] or false, true, q)
  else
    flow_outbox(q, fq, id .. '|e', {'e', f, fq, state, err or false})
  end
end

-- `q`, `id`: the settled job (nil: applied at the root for it); `ext`: its fx, fS,
-- fsq when read already (a removed job's, read before it went).
flow_settle = function(fq, f, fm, fs, state, res, err, now, q, id, ext)
  if flow_ended[f] then return end
  if q and q ~= fq then
    ext = ext or rcall('HMGET', k_job(q, id), 'fx', 'fS', 'fsq')
    if ext[1] == '1' then
      flow_settle_away(q, id, fq, f, fm, fs, state, res, err, now, ext)
      return
    end
  end
  local fk = k_flow(fq, f)
  local meta = rcall('HMGET', fk, 'S', 'n', 'col', 'pol', 'x')
  if not meta[1] then return end  -- the flow has ended: a late member or a cancelled step
  local steps, collector, x = tonumber(meta[1]), meta[3] == '1', meta[5] == '1'
  if fm then
    local i = tonumber(fm)
    -- r<i>: its element and its settled mark (set once); '' for a failed one ('a').
    local el = ''
    if meta[4] == 'c' then
      if state == 'c' then el = '\146\162ok' .. (res or '\192')
      else el = '\146\166failed' .. (err or '\192') end
    elseif state == 'c' then
      el = res or '\192'
    end
    if rcall('HSETNX', fk, 'r' .. i, el) == 0 then return end
    -- k<state letter>: settled members per final state, for inspect (flow_info.lua).
    rcall('HINCRBY', fk, 'k' .. state, 1)
    local link = span_links[f .. '.m' .. i]
    if link and i < MAX_SPAN_LINKS then rcall('HSET', fk, 'l' .. i, link, 'L', 1) end
    if meta[4] ~= 'c' and state ~= 'c' then
      local fi = tonumber(rcall('HGET', fk, 'fi'))
      if not fi or i < fi then
        rcall('HSET', fk, 'fi', i, 'fst', state, 'fe', err or '\192')
      end
    end
    if rcall('HINCRBY', fk, 'c', -1) == 0 then
      flow_fan_in(fq, f, steps, tonumber(meta[2]), collector, now)
    end
    return
  end
  local k = tonumber(fs)
  if state == 'c' then
    if k == steps - 1 then
      rcall('DEL', fk)
    else
      flow_release(fq, f, k + 1, steps, collector, res or '\192', now, nil, x)
    end
  elseif k == steps - 1 and state == 'x' then
    flow_end(fq, f, 'x', nil, now)  -- the flow's own job was cancelled first: stop the rest
  else
    flow_end(fq, f, state, err, now)
  end
end

-- Apply one outbox record (see above) on the slot of queue q: 1 when it changed
-- something, 0 when it had been applied already (or its flow has ended).
local function flow_apply(q, rec, now)
  local kind, f, fq = rec[1], rec[2], rec[3]
  if kind == 'm' then
    local fk = k_flow(fq, f)
    if rcall('EXISTS', fk) == 0 or rcall('HEXISTS', fk, 'r' .. rec[4]) == 1 then
      return 0
    end
    -- The member's process span, for the fan-in's span links (flow_settle reads it).
    if rec[8] then span_links[f .. '.m' .. rec[4]] = rec[8] end
    flow_settle(fq, f, rec[4], nil, rec[5], rec[6] or nil, rec[7] or nil, now)
    return 1
  elseif kind == 'e' then
    if rcall('EXISTS', k_flow(fq, f)) == 0 then return 0 end
    flow_end(fq, f, rec[4], rec[5] or nil, now)
    return 1
  elseif kind == 'r' then
    local k, steps = tonumber(rec[4]), tonumber(rec[5])
    local done = flow_release_at(q, flow_step_id(f, k, steps), fq, f, k, steps, rec[6] == '1',
      rec[7], now, true, q, rec[8] or nil)
    return done and 1 or 0
  end
  local changed = 0
  if kind == 'E' then
    flow_ended[f] = true
    for i = 6, #rec do
      local r = read_hash(q, rec[i], 's')
      if r and (r[1] == 'a' or r[1] == 'w' or r[1] == 's') then changed = 1 end
      flow_end_job(q, rec[i], rec[4], rec[5] or nil, now)
    end
  elseif kind == 'a' then
    local start = tonumber(rec[4])
    for i = 5, #rec do
      local id = rec[i]
      local r = read_hash(q, id, 's', 'fp', 'p', 'fl')
      if r and r[2] and r[4] == f then
        changed = 1
        rcall('HDEL', k_job(q, id), 'fp')
        if i - 4 <= start and r[1] == 's' then
          rcall('ZREM', k_sched(q), id)
          rcall('HDEL', k_job(q, id), 'r')
          rcall('HSET', k_job(q, id), 's', 'w')
          push_waiting(q, sane_prio(r[3]), id, false)
          count(q, 's', -1)
          count(q, 'w', 1)
          work_queues[q] = true
        end
      end
    end
  elseif kind == 'D' then
    for i = 4, #rec do
      local id = rec[i]
      local r = read_hash(q, id, 's', 'fp', 'fl')
      if r and r[1] == 's' and r[2] and r[3] == f then
        changed = 1
        rcall('ZREM', k_sched(q), id)
        rcall('DEL', k_job(q, id))
        count(q, 's', -1)
      end
    end
  end
  return changed
end

-- The flow link of a job about to be deleted (remove, purge): nil for a job of no flow.
local function flow_link(q, id)
  local r = rpcall('HMGET', k_job(q, id), 'fl', 'fm', 'fs', 'fq', 'fx', 'fS', 'fsq')
  if type(r) ~= 'table' or r.err or not r[1] then return nil end
  if not r[4] then r[4] = q end
  r.q, r.id = q, id
  return r
end

-- A job of a flow was deleted (after its key is gone) in state `s`: when it had not
-- finished, its flow treats it as failed with reason flow_broken, never waits for it.
local function flow_removed(link, s)
  if not link or s == 'c' or s == 'f' or s == 'x' then return end
  local now = now_us()
  flow_settle(link[4], link[1], link[2], link[3], 'f', nil,
    failure_record('flow_broken', 'FlowBroken', FLOW_BROKEN, 0, nil, now), now, link.q, link.id,
    {link[5], link[6], link[7]})
end

-- Every attempt's FailureRecord, oldest first, at most ERR_HISTORY: the job hash's 'eh',
-- a msgpack array of bin strings (the records' bytes). Sets 'err' (the newest) too.
-- Lua's cmsgpack has no bin type: the array is read here (nil: not one written here).
local ERR_HISTORY = 10
local function be_int(s, at, width)
  local n = 0
  for i = at, at + width - 1 do n = n * 256 + string.byte(s, i) end
  return n
end
local function read_bins(s)
  local b = string.byte(s, 1)
  local n, at
  if b and b >= 144 and b <= 159 then n, at = b - 144, 2
  elseif b == 220 and #s >= 3 then n, at = be_int(s, 2, 2), 4
  else return nil end
  local out = {}
  for _ = 1, n do
    local t = string.byte(s, at)
    local w = (t == 196 and 1) or (t == 197 and 2) or (t == 198 and 4)
    if not w or at + w > #s then return nil end
    local len = be_int(s, at + 1, w)
    out[#out + 1] = string.sub(s, at + 1 + w, at + w + len)
    at = at + 1 + w + len
  end
  return out
end
local function add_error(q, id, rec)
  local jk = k_job(q, id)
  -- A job failed before 'eh' existed (or garbage there): its last record starts it.
  local old = rcall('HMGET', jk, 'eh', 'err')
  local list = old[1] and read_bins(old[1])
  if not list then list = old[2] and {old[2]} or {} end
  list[#list + 1] = rec
  local first = math.max(1, #list - ERR_HISTORY + 1)
  local parts = {msgpack_array_header(#list - first + 1)}
  for i = first, #list do parts[#parts + 1] = msgpack_bin(list[i]) end
  rcall('HSET', jk, 'err', rec, 'eh', table.concat(parts))
end

-- A schedule's state (typedq.schedule; one field of the schedules hash:
-- 'digest|last|fired_at|fired|skipped|last_job'), read for a firing that moves it from
-- tick `last` to tick `tick`. Its `stale` is the answer to return when the state is gone,
-- garbled, changed since (`digest`, `last`) or `tick` is later than the Redis clock.
local function schedule_state(key, name, digest, last, tick)
  local cur = rcall('HGET', key, name)
  if not cur then return {stale = {'stale', false}} end
  local d, l, fired_at, fired, skipped, last_job =
    string.match(cur, '^([^|]*)|(%-?%d+)|(%d+)|(%d+)|(%d+)|(.*)$')
  if not d then return {stale = {'stale', false}} end
  local now = now_us()
  if d ~= digest or l ~= last or tonumber(tick) <= tonumber(l) or tonumber(tick) > now then
    return {stale = {'stale', cur}}
  end
  return {cur = cur, fired_at = fired_at, fired = tonumber(fired), skipped = tonumber(skipped),
    last_job = last_job, now = now}
end
