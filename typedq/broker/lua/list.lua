#!lua flags=no-writes
-- Ids of up to `limit` jobs of one queue in one state (for inspect and the dashboard),
-- from a position in the state's own order, skipping the first `skip` jobs listed.
-- Positions count the state's entries (a waiting list may hold stale entries, which are
-- never listed: only a job's live entry, the newest of its level, is), so a page
-- resumed at the position this call answers continues exactly where it stopped: on a
-- queue that does not change, pages hold every job once and are full until the last.
-- Orders: waiting: claim order (priority levels, then list order), then the jobs limit
-- gates parked (typedq.limits), gate by gate; scheduled: due time; active: start time
-- (the global lease set is scanned, bounded); final states: most recently finished
-- first.
-- A call examines at most skip + limit + BUDGET entries; one that stops on the budget
-- (many stale entries in a row) answers a shorter page and the position to go on from.
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, state letter, position, skip, limit
-- Returns {next position ('' at the end of the state), skip left, id...}
local q, state = ARGV[2], ARGV[3]
local pos, skip, limit = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if #ARGV ~= 6 or q == '' or not is_int(pos) or pos < 0 or not is_int(skip) or skip < 0
    or not is_int(limit) or limit < 0 then
  return bad_args('list')
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
local function answer(at_end)
  local reply = {at_end and '' or string.format('%d', pos), string.format('%d', skip)}
  for _, id in ipairs(out) do reply[#reply + 1] = id end
  return reply
end
local function ours(id, s)
  local r = read_job(q, id, 's')
  return r and r[1] == s
end
if limit == 0 then return answer(false) end

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
  while true do
    local ids = redis.call('ZRANGE', k_sched(q), pos, pos + CHUNK - 1)
    for _, id in ipairs(ids) do
      pos = pos + 1
      budget = budget - 1
      if ours(id, 's') then take(id) end
      if done() then return answer(false) end
    end
    if #ids < CHUNK then return answer(true) end
  end
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
  while pos < #found do
    pos = pos + 1
    take(found[pos][1])
    if #out >= limit then return answer(pos >= #found) end
  end
  return answer(true)
elseif state == 'c' or state == 'f' or state == 'x' then
  local zkey = k_done(q, state)
  while true do
    local ids = redis.call('ZREVRANGE', zkey, pos, pos + CHUNK - 1)
    for _, id in ipairs(ids) do
      pos = pos + 1
      budget = budget - 1
      if ours(id, state) then take(id) end
      if done() then return answer(false) end
    end
    if #ids < CHUNK then return answer(true) end
  end
end
return bad_args('list')
