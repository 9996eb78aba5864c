#!lua flags=no-writes
-- Ids of up to `limit` jobs of one queue in one state, skipping `offset` (for inspect).
-- waiting: claim order (priority levels, then list order; `offset` counts list
-- positions, so stale entries make pages a little shorter; a stale entry is never
-- listed: only a job's live entry, the newest of its level, is), then the jobs limit
-- gates parked (typedq.limits); scheduled: due time;
-- active: start time (the global lease set is scanned, bounded); final states:
-- most recently finished first (the global finished set is scanned, bounded).
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, state letter, offset, limit
local q, state, offset, limit = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
if #ARGV ~= 5 or q == '' or not is_int(offset) or offset < 0 or not is_int(limit) or limit < 0 then
  return bad_args('list')
end
local SCAN = 20000
local out = {}
local function ours(id, s)
  local r = read_job(q, id, 's')
  return r and r[1] == s
end
if limit == 0 then return out end
if state == 'w' then
  local pos = 0  -- claim-order position of the first entry of the current level
  for _, prio in ipairs(redis.call('ZRANGE', k_levels(q), 0, -1)) do
    local lk = k_wait(q, prio)
    if redis.call('TYPE', lk).ok == 'list' then
      local len = redis.call('LLEN', lk)
      local a, b = math.max(offset, pos), math.min(offset + limit, pos + len)
      if a < b then
        -- claim-order indexes [a-pos, b-pos) are list indexes [len-(b-pos), len-1-(a-pos)]
        local first = len - (b - pos)
        local ids = redis.call('LRANGE', lk, first, len - 1 - (a - pos))
        local sk = k_stale(q)
        for i = #ids, 1, -1 do
          local id = ids[i]
          if not is_bare(id) then
            -- A waiting entry (see keys.py): listed while live.
            local f = parse_entry(id)
            if f and entry_live(q, prio, f) then out[#out + 1] = f.id end
          else
            local r = read_keyed(q, id, 's', 'q', 'p')
            if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio
                and (not redis.call('HGET', sk, prio .. '|' .. id)
                  or redis.call('LPOS', lk, id) == first + i - 1) then
              out[#out + 1] = id
            end
          end
        end
      end
      pos = pos + len
      if pos >= offset + limit then break end
    end
  end
  -- Then the waiting jobs a limit gate parked (typedq.limits), gate by gate, each
  -- gate's in the order it gives them back.
  if pos < offset + limit then
    local seen = {}
    for _, id in ipairs(out) do seen[id] = true end
    for _, gate in ipairs(redis.call('ZRANGE', k_gates(q), 0, 999)) do
      local lk = k_gate(q, gate)
      local len = redis.call('LLEN', lk)
      local a, b = math.max(offset, pos), math.min(offset + limit, pos + len)
      if a < b then
        local first = len - (b - pos)
        local entries = redis.call('LRANGE', lk, first, len - 1 - (a - pos))
        for i = #entries, 1, -1 do
          local prio, id = string.match(entries[i], '^(%-?%d+)|(.*)$')
          local r = prio and read_keyed(q, id, 's', 'q', 'p')
          if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio and not seen[id] then
            seen[id] = true
            out[#out + 1] = id
          end
        end
      end
      pos = pos + len
      if pos >= offset + limit then break end
    end
  end
elseif state == 's' then
  for _, id in ipairs(redis.call('ZRANGE', k_sched(q), offset, offset + limit - 1)) do
    if ours(id, 's') then out[#out + 1] = id end
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
  for i = offset + 1, math.min(#found, offset + limit) do out[#out + 1] = found[i][1] end
else
  local zkey
  if state == 'c' or state == 'f' or state == 'x' then zkey = k_done(q, state)
  else return bad_args('list') end
  local skipped, start = 0, 0
  while #out < limit and start < SCAN + offset do
    local ids = redis.call('ZREVRANGE', zkey, start, start + 999)
    if #ids == 0 then break end
    for _, id in ipairs(ids) do
      if ours(id, state) then
        if skipped < offset then skipped = skipped + 1
        elseif #out < limit then out[#out + 1] = id end
      end
    end
    start = start + 1000
  end
end
return out
