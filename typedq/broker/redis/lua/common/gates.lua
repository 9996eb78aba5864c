-- common/gates.lua: Limits at claim time (typedq/limits.py; the embedded broker's
-- typedq/broker/memory/limits.py is the reference): reading a job body's task and limit
-- keys, rate windows and concurrency slots, admitting a job or parking it by its closed
-- gate, and how many jobs an open gate gives back.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
--
-- claim.lua's helpers, here and in common/claiming.lua, are fields of one table made at
-- load (the library's main chunk holds at most 200 locals: a local per helper would use
-- them up). They take the claim's state as a table `c` (claim.lua makes it once per
-- call): c.now (the claim's clock), c.cfg (task -> {rate, per_us, concurrency,
-- spacing_us, early_us}), c.windows (rate bucket -> starts in its window, read once per
-- claim), c.expiring (rate buckets whose TTL this claim set) and c.holders (concurrency
-- bucket -> slots held, read once per claim); the last four only in a claim that limits
-- tasks or finds a queue with gates.
local claim_ops = {}  --@keep

-- Limits. A job body is a msgpack array [task, payload, fingerprint, priority,
-- max_retries, timeout, eta, delay, rate_key, concurrency_key] with trailing defaults
-- left out (see redis/codec.py). Redis' cmsgpack cannot read msgpack bin values (the
-- payload), so the few fields needed are read here by skipping over the others.
function claim_ops.mp_uint(s, i, n)
  local v = 0
  for k = i, i + n - 1 do v = v * 256 + (string.byte(s, k) or 0) end
  return v
end

-- The msgpack string at `i` and the offset after it (nil: not a string, or one cut short).
function claim_ops.mp_str(s, i)
  local mp_uint = claim_ops.mp_uint
  local b = string.byte(s, i)
  if not b then return nil end
  local len, at
  if b >= 0xa0 and b <= 0xbf then len, at = b - 0xa0, i + 1
  elseif b == 0xd9 then len, at = mp_uint(s, i + 1, 1), i + 2
  elseif b == 0xda then len, at = mp_uint(s, i + 1, 2), i + 3
  else return nil end
  if at + len - 1 > #s then return nil end  -- cut short: not a string
  return string.sub(s, at, at + len - 1), at + len
end

-- The task, its limits, the rate key and the concurrency key of a job body; nil for a
-- task this claim does not limit (not in `cfg`). A limited body whose keys cannot be
-- read uses the task-wide buckets ('').
function claim_ops.limits_of(cfg, body)
  local mp_str = claim_ops.mp_str
  local b = string.byte(body, 1)
  if not b then return nil end
  local n, i
  if b >= 0x90 and b <= 0x9f then n, i = b - 0x90, 2
  elseif b == 0xdc then n, i = claim_ops.mp_uint(body, 2, 2), 4
  else return nil end
  if n < 1 then return nil end
  local task
  task, i = mp_str(body, i)
  local c = task and cfg[task]
  if not c then return nil end
  local keys = {'', ''}
  if n >= 9 then
    for _ = 2, 8 do
      i = i and mp_skip(body, i)
    end
    for k = 1, math.min(n - 8, 2) do
      local v
      if i then v, i = mp_str(body, i) end
      keys[k] = v or ''
    end
  end
  return task, c, keys[1], keys[2]
end

-- A gate gives its parked jobs back from its tail, so it keeps them best first from
-- there, as the levels are: an entry goes behind every parked one of its priority or
-- higher (the embedded broker keeps a heap). Usually that is the head (LPUSH); a job
-- of a higher priority than the head's looks through at most PARK_SCAN entries.
function claim_ops.park(q, gate, prio, id, opens)
  local PARK_SCAN = 1000
  local lk, entry, p = k_gate(q, gate), prio .. '|' .. id, tonumber(prio)
  local head = rcall('LINDEX', lk, 0)
  local hp = head and tonumber(string.match(head, '^(%-?%d+)|'))
  if not hp or hp >= p then
    rcall('LPUSH', lk, entry)
  else
    local rows, placed = rcall('LRANGE', lk, 0, PARK_SCAN - 1), false
    for i = 2, #rows do
      local rp = tonumber(string.match(rows[i], '^(%-?%d+)|'))
      if rp and rp >= p then
        rcall('LINSERT', lk, 'BEFORE', rows[i], entry)  -- behind it, toward the head
        placed = true
        break
      end
    end
    if not placed then
      -- The best parked (all looked at), else past the scan: near enough, at the head.
      if #rows < PARK_SCAN then rcall('RPUSH', lk, entry) else rcall('LPUSH', lk, entry) end
    end
  end
  rcall('HSET', k_parked(q), id, gate)
  rcall('ZADD', k_gates(q), opens, gate)
end

-- A rate bucket's starts in (now - per, now], counted once per claim (older ones go).
function claim_ops.window(c, rkey, per)
  local n = c.windows[rkey]
  if not n then
    rcall('ZREMRANGEBYSCORE', rkey, '-inf', string.format('%d', c.now - per))
    n = rcall('ZCARD', rkey)
    c.windows[rkey] = n
  end
  return n
end

-- How many slots of a concurrency bucket are held, read once per claim; ghosts of
-- deleted active jobs whose lease has ended leave first (common/finish.lua's ghost_slot).
function claim_ops.held(c, q, slot)
  local sk = k_slots(q, slot)
  local n = c.holders[sk]
  if not n then
    local gz = sk .. ':g'
    local ended = rcall('ZRANGEBYSCORE', gz, '-inf', c.now)
    if #ended > 0 then
      rcall('SREM', sk, unpack(ended))
      rcall('ZREMRANGEBYSCORE', gz, '-inf', c.now)
    end
    n = rcall('SCARD', sk)
    c.holders[sk] = n
  end
  return n
end

-- When a full concurrency bucket frees a slot by itself: its first ghost's end (none:
-- '+inf', a running job's settle opens the gate).
function claim_ops.ghost_ends(q, slot)
  local g = rcall('ZRANGE', k_slots(q, slot) .. ':g', 0, 0, 'WITHSCORES')
  if #g == 0 then return '+inf' end
  return g[2]
end

-- When a full window (n >= rate starts) opens: once the start `rate` places back leaves.
function claim_ops.window_opens(c, rkey, n, rate, per)
  local t = rcall('ZRANGE', rkey, n - rate, n - rate, 'WITHSCORES')
  if #t == 0 then return c.now end
  return tonumber(t[2]) + per
end

-- The bucket's next turn: `gap` after its last start's turn (spaced starts,
-- typedq.limits RateLimit.spacing_us; gap <= per, so the last one is in the window),
-- and never before now. A start is recorded at its turn, which may be up to `early`
-- after now.
function claim_ops.next_turn(c, rkey, n, gap)
  if gap == 0 or n == 0 then return c.now end
  local t = rcall('ZRANGE', rkey, -1, -1, 'WITHSCORES')
  if #t == 0 then return c.now end
  return math.max(c.now, tonumber(t[2]) + gap)
end

-- Admit a job (take its place in the rate window and a concurrency slot) or park it by
-- its closed gate: concurrency first, then rate. Returns admitted, and the slot it holds.
function claim_ops.admit(c, id, q, prio, body)
  local task, lim, rk, ck = claim_ops.limits_of(c.cfg, body)
  if not task then return true, nil end
  local now = c.now
  local slot
  if lim[3] > 0 then
    slot = task .. '|' .. ck
    if claim_ops.held(c, q, slot) >= lim[3] then
      claim_ops.park(q, 'c|' .. slot, prio, id, claim_ops.ghost_ends(q, slot))
      return false, nil
    end
  end
  if lim[1] > 0 then
    local rkey = k_rate(q, task, rk)
    local n = claim_ops.window(c, rkey, lim[2])
    if n >= lim[1] then
      claim_ops.park(q, 'r|' .. task .. '|' .. rk, prio, id,
        claim_ops.window_opens(c, rkey, n, lim[1], lim[2]))
      return false, nil
    end
    local turn = claim_ops.next_turn(c, rkey, n, lim[4])
    if turn > now + lim[5] then
      claim_ops.park(q, 'r|' .. task .. '|' .. rk, prio, id, turn - lim[5])
      return false, nil
    end
    local at = string.format('%d', turn)
    rcall('ZADD', rkey, at, id .. '@' .. at)
    if not c.expiring[rkey] then
      c.expiring[rkey] = true
      -- Once its last start leaves the window, a bucket is as good as new: it expires
      -- (set once per bucket and claim: all of this claim's starts share `now`).
      rcall('PEXPIRE', rkey, math.floor((lim[2] + lim[5]) / 1000) + 1)
    end
    c.windows[rkey] = n + 1
  end
  if slot then
    local sk = k_slots(q, slot)
    rcall('SADD', sk, id)
    c.holders[sk] = c.holders[sk] + 1
  end
  return true, slot
end

-- How many jobs an open gate's bucket admits now (nil: this claim does not limit its
-- task), and when it opens next.
function claim_ops.allowance(c, q, gate)
  local kind, task, key = string.match(gate, '^([rc])|([^|]*)|(.*)$')
  local lim = task and c.cfg[task]
  if not lim then return nil end
  local now = c.now
  if kind == 'c' then
    if lim[3] == 0 then return nil end
    local slot = task .. '|' .. key
    return math.max(0, lim[3] - claim_ops.held(c, q, slot)), claim_ops.ghost_ends(q, slot)
  end
  if lim[1] == 0 then return nil end
  local rkey = k_rate(q, task, key)
  local n = claim_ops.window(c, rkey, lim[2])
  if n >= lim[1] then return 0, claim_ops.window_opens(c, rkey, n, lim[1], lim[2]) end
  if lim[4] > 0 then
    -- Spaced: the turns from the next one to now + early.
    local turn = claim_ops.next_turn(c, rkey, n, lim[4])
    if turn > now + lim[5] then return 0, turn - lim[5] end
    return math.min(lim[1] - n, math.floor((now + lim[5] - turn) / lim[4]) + 1), now
  end
  return lim[1] - n, now
end

-- Queue q's open gates give back as many parked jobs as their bucket admits (bounded by
-- the claim's `limit`), at their old place among the waiting jobs; a gate whose bucket
-- is still closed gets its true opening time. A gate of a task this claim does not limit
-- (a deploy dropped the limit) gives back as many as it is asked for.
function claim_ops.open_gates(c, q, limit)
  local gk = k_gates(q)
  local open = rcall('ZRANGEBYSCORE', gk, '-inf', c.now, 'LIMIT', 0, 64)
  for _, gate in ipairs(open) do
    local lk = k_gate(q, gate)
    local n, opens = claim_ops.allowance(c, q, gate)
    if n == nil or n > limit then n = limit end
    if n == 0 then
      rcall('ZADD', gk, opens, gate)
    else
      local back = {}
      -- A counted stale entry (its job was cancelled or removed while parked) is
      -- consumed here and admits nothing: the gate gives back another in its place.
      local popped, want = {}, n
      while want > 0 do
        local got = rcall('RPOP', lk, want)
        if not got then break end
        want = 0
        for _, e in ipairs(got) do
          local prio, id = string.match(e, '^(%-?%d+)|(.*)$')
          if prio and take_stale(q, prio, id) then want = want + 1
          else popped[#popped + 1] = e end
        end
      end
      for _, e in ipairs(popped) do
        local prio, id = string.match(e, '^(%-?%d+)|(.*)$')
        if prio then
          rcall('HDEL', k_parked(q), id)
          -- A job that left waiting meanwhile goes back as a dead entry, first (its
          -- cancel or remove counted it stale; whoever pops it consumes that).
          -- A fair job goes back into its key's lane (push_back_in_order): a hash
          -- names its key ('fk'), a job string's body does (lanes.lua fair_of).
          local r, ty = read_keyed(q, id, 's', 'q', 'p', 'o', 'fk', 'm')
          local order, fk = 0, nil
          if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio then
            order, fk = tonumber(r[4]) or 0, r[5] or nil
            if not fk and ty == 'string' then
              local group, weight = fair_of(r[6])
              if group then fk = weight .. '|' .. group end
            end
          end
          back[#back + 1] = {id, q, prio, order, fk}
        end
      end
      push_back_in_order(back)
      if rcall('EXISTS', lk) == 0 then rcall('ZREM', gk, gate) end
    end
  end
end
