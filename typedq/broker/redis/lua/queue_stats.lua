#!lua flags=no-writes
-- Counts per state and the age of the longest-waiting job, per queue (a metrics
-- scrape: one round trip for every queue). A waiting job's age counts from when it
-- became due: its due time 'r' when it has one (a retry's due time, a hand-back, a
-- stall recovery, a workflow hand-off, a scheduled job moved to waiting), else its
-- enqueue time or the time its body's delay or eta named. The longest-waiting job of a
-- priority level is among the live entries at its head (the right end of its list, the
-- last HEAD_SCAN entries): mostly the head itself, but a job handed back to its old
-- place or a workflow step pushed at the head waits since its hand-back only. A due
-- scheduled job not yet moved to waiting counts from its due time too.
-- KEYS: the counts hash of each queue (declared for routing; read by name below)
-- ARGV: P, queue...
-- Returns per queue: its counts hash as a flat list, then the age in microseconds.
local HEAD_SCAN = 16

-- Reading a job body (msgpack) without decoding it (cmsgpack knows no bin type): the
-- index after the item at `i` is common/lanes.lua's mp_skip; the number at `i` (floats,
-- positive fixints; nil otherwise).
local function mp_number(m, i)
  local b = string.byte(m, i)
  if b == 0xcb and #m >= i + 8 then return (struct.unpack('>d', m, i + 1)) end
  if b == 0xca and #m >= i + 4 then return (struct.unpack('>f', m, i + 1)) end
  if b and b <= 0x7f then return b end
  return nil
end

-- When a waiting job enqueued at `e` (µs) became due: the eta or delay of its body `m`
-- (fields 7 and 8, seconds); a body of fewer fields has neither and is not read.
local function due_us(e, m)
  local n = m and string.byte(m, 1)
  if not n or n < 0x97 or n > 0x9f then return e end
  local i = 2
  for _ = 1, 6 do
    i = mp_skip(m, i)
    if not i then return e end
  end
  local eta = mp_number(m, i)
  if eta and eta > 0 then return math.max(e, math.floor(eta * 1000000)) end
  i = mp_skip(m, i)
  local delay = i and mp_number(m, i)
  if delay and delay > 0 then return e + math.floor(delay * 1000000) end
  return e
end

local now = now_us()
local out = {}
for i = 2, #ARGV do
  local q = ARGV[i]
  local oldest = nil
  for _, prio in ipairs(redis.call('ZRANGE', k_levels(q), 0, -1)) do
    local lk = k_wait(q, prio)
    if redis.call('TYPE', lk).ok == 'list' then
      local ids = redis.call('LRANGE', lk, -HEAD_SCAN, -1)
      for j = #ids, 1, -1 do
        local r
        if is_bare(ids[j]) then
          r = read_keyed(q, ids[j], 's', 'e', 'r', 'm')
        else
          local f = parse_entry(ids[j])  -- a waiting entry (see keys.py)
          if f and entry_live(q, prio, f) then r = {'w', f.e, f.r, f.m} end
        end
        if r and r[1] == 'w' then
          local e = tonumber(r[3])
          if not e then
            -- Due since its enqueue or its body's eta/delay: never before its enqueue,
            -- so the body is read only when the enqueue time is the oldest so far.
            e = tonumber(r[2])
            if e and (not oldest or e < oldest) then e = due_us(e, r[4] or nil) end
          end
          if e and (not oldest or e < oldest) then oldest = e end
        end
      end
    end
  end
  local due = redis.call('ZRANGEBYSCORE', k_sched(q), '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
  if due[2] then
    local d = tonumber(due[2])
    if d and (not oldest or d < oldest) then oldest = d end
  end
  local age = 0
  if oldest and oldest < now then age = now - oldest end
  out[#out + 1] = redis.call('HGETALL', k_counts(q))
  out[#out + 1] = age
end
return out
