#!lua flags=no-writes
-- Ids of up to `limit` jobs of one queue in one state (for inspect and the dashboard),
-- from a cursor in the state's own order ('' for the start), skipping the first `skip`
-- jobs listed. Orders: waiting: claim order (priority levels, then list order), then
-- the jobs limit gates parked (typedq.limits), gate by gate; scheduled: due time;
-- active: start time (the global lease set is scanned, bounded); final states: most
-- recently finished first.
-- Cursors: waiting: a position that counts the state's entries (a waiting list may hold
-- stale entries, which are never listed: only a job's live entry, the newest of its
-- level, is); scheduled and final states: '<score>|<id>' of the last entry examined,
-- and active: '<start>|<order>' of the last job examined. A cursor of a sorted set or
-- of the active jobs names a place, not a count: a page resumed there goes on after
-- that place wherever the entries before it went meanwhile (also when the entry itself
-- left: its score and id still say where it was), so a job that stays in the state is
-- listed once. On a queue that does not change, pages hold every job once and are full
-- until the last.
-- A call examines at most skip + limit + BUDGET entries; one that stops on the budget
-- (many stale entries in a row) answers a shorter page and the cursor to go on from.
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, state letter, cursor, skip, limit
-- Returns {next cursor ('' at the end of the state), skip left, id...}
local q, state, cur = ARGV[2], ARGV[3], ARGV[4]
local skip, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
if #ARGV ~= 6 or q == '' or not is_int(skip) or skip < 0
    or not is_int(limit) or limit < 0 then
  return bad_args('list')
end
local pos = 0
if state == 'w' and cur ~= '' then
  pos = tonumber(cur)
  if not is_int(pos) or pos < 0 then return bad_args('list') end
end
local SCAN, BUDGET, CHUNK = 20000, 20000, 1000
local out = {}
local budget = skip + limit + BUDGET
local function take(id)
  if skip > 0 then skip = skip - 1 else out[#out + 1] = id end
end
-- True when the page is full or the budget spent: stop after the entry just examined.
local function done()
  return #out >= limit or budget <= 0
end
-- The reply: `at` is the cursor to go on from ('' at the end of the state).
local function reply_at(at)
  local reply = {at, string.format('%d', skip)}
  for _, id in ipairs(out) do reply[#reply + 1] = id end
  return reply
end
local function answer(at_end)
  return reply_at(at_end and '' or string.format('%d', pos))
end
local function ours(id, s)
  local r = read_job(q, id, 's')
  return r and r[1] == s
end
-- a < b in the byte order Redis gives members of equal score (Lua's `<` follows the
-- locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
-- Walks the sorted set `key` (descending when `rev`) after the place '<score>|<id>'
-- in `cur`, listing the members in state `s`.
local function zwalk(key, rev, s)
  local at, tie_score, tie_id = 0, nil, nil
  if cur ~= '' then
    local sc, id = string.match(cur, '^([^|]+)|(.+)$')
    local score = sc and tonumber(sc)
    if not score or score ~= score then return bad_args('list') end
    local have = redis.call('ZSCORE', key, id)
    if have and tonumber(have) == score then
      at = redis.call(rev and 'ZREVRANK' or 'ZRANK', key, id) + 1
    else
      -- The entry left: go on from where it was, passing the entries of its score that
      -- came before it in the set's order (members of equal score are in byte order).
      tie_score, tie_id = score, id
      if rev then
        at = redis.call('ZCOUNT', key, '(' .. sc, '+inf')
      else
        at = redis.call('ZCOUNT', key, '-inf', '(' .. sc)
      end
    end
  end
  while true do
    local rows = redis.call(rev and 'ZREVRANGE' or 'ZRANGE', key, at, at + CHUNK - 1,
      'WITHSCORES')
    for i = 1, #rows, 2 do
      local id, sc = rows[i], rows[i + 1]
      at = at + 1
      local passed = tie_score and tonumber(sc) == tie_score
        and (id == tie_id or before(id, tie_id) ~= (rev and true or false))
      if not passed then
        tie_score = nil  -- past the ties: every later entry is after the place
        budget = budget - 1
        if ours(id, s) then take(id) end
        if done() then return reply_at(sc .. '|' .. id) end
      end
    end
    if #rows < 2 * CHUNK then return reply_at('') end
  end
end
if limit == 0 then return reply_at(cur) end

-- Walks one list in claim order (its tail first) from list position `pos - base`,
-- calling `visit(entry)` per entry; answers true when the walk must stop here.
local function walk(lk, base, len, visit)
  while pos < base + len do
    local c = pos - base  -- claim-order index: list index len - 1 - c
    local n = math.min(CHUNK, base + len - pos)
    local entries = redis.call('LRANGE', lk, len - c - n, len - 1 - c)
    for i = #entries, 1, -1 do
      pos = pos + 1
      budget = budget - 1
      visit(entries[i])
      if done() then return true end
    end
    if #entries < n then pos = base + len end  -- the list shrank meanwhile
  end
  return false
end

if state == 'w' then
  local base = 0
  local sk = k_stale(q)
  for _, prio in ipairs(redis.call('ZRANGE', k_levels(q), 0, -1)) do
    local lk = k_wait(q, prio)
    if redis.call('TYPE', lk).ok == 'list' then
      local len = redis.call('LLEN', lk)
      if pos < base + len then
        local stop = walk(lk, base, len, function(entry)
          if not is_bare(entry) then
            -- A waiting entry (see keys.py): listed while live.
            local f = parse_entry(entry)
            if f and entry_live(q, prio, f) then take(f.id) end
          else
            local r = read_keyed(q, entry, 's', 'q', 'p')
            if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio
                and (not redis.call('HGET', sk, prio .. '|' .. entry)
                  or redis.call('LPOS', lk, entry) == len - (pos - base)) then
              take(entry)
            end
          end
        end)
        if stop then return answer(false) end
      end
      base = base + len
    end
  end
  -- Then the waiting jobs a limit gate parked (typedq.limits), gate by gate, each
  -- gate's in the order it gives them back.
  for _, gate in ipairs(redis.call('ZRANGE', k_gates(q), 0, 999)) do
    local lk = k_gate(q, gate)
    local len = redis.call('LLEN', lk)
    if pos < base + len then
      local stop = walk(lk, base, len, function(entry)
        local prio, id = string.match(entry, '^(%-?%d+)|(.*)$')
        local r = prio and read_keyed(q, id, 's', 'q', 'p')
        if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio then take(id) end
      end)
      if stop then return answer(false) end
    end
    base = base + len
  end
  return answer(true)
elseif state == 's' then
  return zwalk(k_sched(q), false, 's')
elseif state == 'a' then
  local found = {}
  for _, id in ipairs(redis.call('ZRANGE', k_active(q), 0, SCAN - 1)) do
    local r = read_hash(q, id, 's', 'q', 'st', 'o')
    if r and r[1] == 'a' then
      found[#found + 1] = {id, tonumber(r[3]) or 0, tonumber(r[4]) or 0}
    end
  end
  table.sort(found, function(x, y)
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[3] < y[3]
  end)
  local st, o = -math.huge, -math.huge
  if cur ~= '' then
    local a, b = string.match(cur, '^([^|]+)|([^|]+)$')
    st, o = tonumber(a or ''), tonumber(b or '')
    if not st or not o then return bad_args('list') end
  end
  for i, job in ipairs(found) do
    if job[2] > st or (job[2] == st and job[3] > o) then
      take(job[1])
      if #out >= limit then
        if i == #found then return reply_at('') end
        return reply_at(string.format('%.17g|%.17g', job[2], job[3]))
      end
    end
  end
  return reply_at('')
elseif state == 'c' or state == 'f' or state == 'x' then
  return zwalk(k_done(q, state), true, state)
end
return bad_args('list')
