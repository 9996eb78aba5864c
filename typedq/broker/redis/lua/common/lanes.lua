-- common/lanes.lua: Waiting entries: level lists, the waiting index, finding and taking an entry,
-- reading a job in any state.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
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
-- table: common/claiming.lua's activate, once per claimed job); nil for a bare id, a removed
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

-- A level is listed in the levels zset while its list holds entries: every push lists
-- it, and a level goes only once its list is gone (claim.lua, head_of, purge). So a
-- push onto a list that held entries already (LPUSH answers more than it pushed) has
-- its level listed: no ZADD (the claim's push_tails does the same).
local function push_entry(q, prio, id, o, e, m, r)
  rcall('HSET', k_idx(q, id), id, idx_val(o, prio))
  if rcall('LPUSH', k_wait(q, prio), pack_entry(id, o, e, m, r)) == 1 then
    rcall('ZADD', k_levels(q), level_score(prio), prio)
  end
end

-- Push packed waiting entries (enqueue.lua) onto level `prio`'s list `lk` of queue `q`,
-- 500 per LPUSH, and list the level when its list was empty (see push_entry).
local function push_entries(q, prio, lk, entries)
  local listed = true
  for s = 1, #entries, 500 do
    local e = math.min(s + 499, #entries)
    if rcall('LPUSH', lk, unpack(entries, s, e)) == e - s + 1 then listed = false end
  end
  if not listed then rcall('ZADD', k_levels(q), level_score(prio), prio) end
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

local function entry_order(v)
  if string.byte(v, 1) == 126 then return nil end  -- a fair key's marker ('~')
  return tonumber(string.match(v, '^[^|]+|(%d+)|'))
end

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


-- Fair shares (typedq.fair; keys.py has the layout). A fair job keeps a job string of
-- its own while it waits and its id waits in its key's lane (Q fk:<task>|<key>:<prio>,
-- LPUSH at the tail); the level list holds one marker for the key while its lane has
-- jobs, '~<taken>|<weight>|<task>|<key>' (an id starts with a letter or digit, an entry
-- with it: never '~'). A claim that pops the marker takes up to `weight` jobs from the
-- lane (its turn; `taken` so far, when a claim ran out of room mid-turn) and pushes the
-- marker back at the tail while the lane has jobs (at the head, mid-turn).
-- Job bodies and records are msgpack that Redis' cmsgpack cannot read (it knows no bin
-- type, and a body's payload is one), so the scripts read the few fields they need by
-- skipping over the others: the offset after the msgpack scalar at `i` of `s` (nil: not
-- one a body holds). The one copy: gates (claim_ops), queue_stats, list and flows use it.
local function mp_skip(s, i)
  local b = string.byte(s, i)
  if not b then return nil end
  if b <= 0x7f or b >= 0xe0 or b == 0xc0 or b == 0xc2 or b == 0xc3 then return i + 1 end
  if b >= 0xa0 and b <= 0xbf then return i + 1 + b - 0xa0 end
  if b == 0xc4 or b == 0xd9 then return i + 2 + (string.byte(s, i + 1) or 0) end
  if b == 0xc5 or b == 0xda then
    local x, y = string.byte(s, i + 1, i + 2)
    return i + 3 + (x or 0) * 256 + (y or 0)
  end
  if b == 0xc6 or b == 0xdb then
    local w, x, y, z = string.byte(s, i + 1, i + 4)
    return i + 5 + (((w or 0) * 256 + (x or 0)) * 256 + (y or 0)) * 256 + (z or 0)
  end
  if b == 0xcc or b == 0xd0 then return i + 2 end
  if b == 0xcd or b == 0xd1 then return i + 3 end
  if b == 0xca or b == 0xce or b == 0xd2 then return i + 5 end
  if b == 0xcb or b == 0xcf or b == 0xd3 then return i + 9 end
  return nil
end

-- The fair group '<task>|<key>' and weight of a job body (nil: not a fair job). A fair
-- body has all 16 fields (redis/codec.py): an array16 header 0xdc 0x00 0x10; any other
-- body costs one byte compare.
local function fair_of(body)
  if not body or string.byte(body, 1) ~= 0xdc or string.byte(body, 3) ~= 16 then return nil end
  local i = 4
  local b = string.byte(body, i)
  local task
  if b and b >= 0xa0 and b <= 0xbf then task = string.sub(body, i + 1, i + b - 0xa0)
  elseif b == 0xd9 then task = string.sub(body, i + 2, i + 1 + string.byte(body, i + 1))
  else return nil end
  for _ = 1, 14 do
    i = mp_skip(body, i)
    if not i then return nil end
  end
  b = string.byte(body, i)
  local key
  if b and b >= 0xa0 and b <= 0xbf then key, i = string.sub(body, i + 1, i + b - 0xa0), i + 1 + b - 0xa0
  elseif b == 0xd9 then
    local len = string.byte(body, i + 1)
    key, i = string.sub(body, i + 2, i + 1 + len), i + 2 + len
  else return nil end
  b = string.byte(body, i)
  local w
  if b and b >= 1 and b <= 0x7f then w = b
  elseif b == 0xcc then w = string.byte(body, i + 1)
  elseif b == 0xcd then w = string.byte(body, i + 1) * 256 + string.byte(body, i + 2)
  else return nil end
  if not w or w < 1 then return nil end
  return task .. '|' .. key, w
end

-- Fair job `id` waits in its key's lane (the tail); a key that had no job waiting joins
-- its level's line (the marker at the tail). Returns true when it joined.
-- A key's weight is its newest job's, from the key's next turn on: a new job (`weight`
-- its own) whose weight differs from the lane's (the F hash, one HGET) sets the lane's
-- and lists the lane in FC, which the claim reads at the key's next turn
-- (claim_ops.take_turn): the marker, somewhere in the level list, is not rewritten.
-- `again` (a retry: a job claimed before) leaves the key's weight as it is; a key it
-- makes join the line gets the job's own weight, from its body (the embedded broker's
-- message.fair_weight), `weight` (its fk's) only when the body names none.
local function lane_push(q, prio, id, group, weight, again)
  local field = prio .. '|' .. group
  if rcall('LPUSH', k_lane(q, group, prio), id) > 1 then
    if not again then
      local w = int_text(weight)
      if rcall('HGET', k_lanes(q), field) ~= w then
        rcall('HSET', k_lanes(q), field, w)
        rcall('SADD', k_lanes(q, true), field)
      end
    end
    return false
  end
  if again then
    local r = read_keyed(q, id, 'm')
    local _, w = fair_of(r and r[1])
    if w then weight = w end
  end
  rcall('LPUSH', k_wait(q, prio), '~0|' .. weight .. '|' .. group)
  rcall('ZADD', k_levels(q), level_score(prio), prio)
  rcall('HSET', k_lanes(q), field, weight)
  return true
end

-- A marker's parts: taken, weight, group (nil: not a marker).
local function marker_parts(v)
  local t, w, g = string.match(v, '^~(%d+)|(%d+)|(.+)$')
  if not t then return nil end
  return tonumber(t), tonumber(w), g
end

-- Store fair job `id` (body `m`, fair_of's `group` and `weight`) waiting: its job string
-- (order `o`, enqueued_at `e`, due time `r` or false) and its id in its key's lane.
local function store_fair(q, prio, id, o, e, m, r, group, weight)
  rcall('SET', k_job(q, id), pack_rec({s = 'w', q = q, o = o, e = e,
    p = prio ~= '0' and prio, r = r, m = m}))
  lane_push(q, prio, id, group, weight)
end
