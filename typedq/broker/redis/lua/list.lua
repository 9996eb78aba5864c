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
-- Counting (ARGV[7] 'n', typedq verify's count_fingerprints): the same walk, but each
-- job taken is counted by the task and fingerprint its stored body names, and the reply
-- holds those counts instead of ids: the jobs never leave Redis, and a call that takes
-- `limit` jobs costs about what a page of them does (less: a waiting entry is not
-- looked up in the index while no entry can be stale, see `fast`; scheduled job
-- strings are read in one MGET per chunk). Active jobs are walked in the active set's
-- order (lease deadline) instead: counting needs no start-time order, and the sort of
-- every active job per call would cost each page the whole state.
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, state letter, cursor, skip, limit[, 'n']
-- Returns {next cursor ('' at the end of the state), skip left, id...}; counting:
-- {next cursor, skip left, jobs counted, task, fingerprint, jobs, task, ...} (a body
-- typedq did not write is counted in the jobs, under no task).
local q, state, cur = ARGV[2], ARGV[3], ARGV[4]
local skip, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local counting = ARGV[7] == 'n'
if (#ARGV ~= 6 and not (#ARGV == 7 and counting)) or q == '' or not is_int(skip)
    or skip < 0 or not is_int(limit) or limit < 0 then
  return bad_args('list')
end
local pos = 0
if state == 'w' and cur ~= '' then
  pos = tonumber(string.match(cur, '^(%d+)'))
  if not is_int(pos) or pos < 0 then return bad_args('list') end
end
local SCAN, BUDGET, CHUNK, WINDOW = 20000, 20000, 1000, 1000
-- Counting: the most jobs a call counts but in a `fast` walk of the waiting lists (one
-- reading entries with no index lookup, ~13k instructions a job; a checked one,
-- scheduled job records and hashes cost 20-35k each): every call a few milliseconds.
local CHECKED = 500
local asked = limit
if counting then limit = math.min(limit, CHECKED) end
local out = {}
local budget = skip + limit + BUDGET
-- Counting: jobs counted, and tally[task][fingerprint] = jobs.
local counted, tally = 0, {}

local str_at = claim_ops.mp_str

-- The offset after the msgpack bin at `i` of `s` (nil: not a bin).
local function after_bin(s, i)
  local b = string.byte(s, i)
  if b == 0xc4 or b == 0xc5 or b == 0xc6 then return mp_skip(s, i) end
  return nil
end

-- The task and fingerprint a stored body names, from offset `i` of `m` (the body may
-- sit inside a waiting entry: not copied out), reading its first fields only (the
-- payload is skipped): a body (redis/codec.py Body) is [task, payload (bin),
-- fingerprint, ...] with the fingerprint left out when empty; a record written before
-- bodies is a whole JobMessage, [id, task, queue, payload, fingerprint, ...] (its second
-- field a string, not bin). nil for other bytes.
local function body_key(m, i)
  local b = string.byte(m, i)
  local n
  if not b then return nil end
  if b >= 0x90 and b <= 0x9f then n, i = b - 0x90, i + 1
  elseif b == 0xdc then
    local x, y = string.byte(m, i + 1, i + 2)
    if not y then return nil end
    n, i = x * 256 + y, i + 3
  else return nil end
  if n < 2 then return nil end
  local first, second
  first, i = str_at(m, i)
  if not first then return nil end
  local past = after_bin(m, i)
  if past then  -- a body: the payload second
    if n < 3 then return first, '' end
    local fp = str_at(m, past)
    if not fp then return nil end
    return first, fp
  end
  second, i = str_at(m, i)  -- a whole JobMessage: its task second
  if not second or n < 4 then return nil end
  if n < 5 then return second, '' end
  for _ = 1, 2 do  -- the queue, the payload
    i = mp_skip(m, i)
    if not i then return nil end
  end
  local fp = str_at(m, i)
  if not fp then return nil end
  return second, fp
end

-- Take job `id` (its stored body `m` from offset `at`, when at hand: counting reads it
-- otherwise).
local function take(id, m, at)
  if skip > 0 then skip = skip - 1; return end
  if not counting then out[#out + 1] = id; return end
  counted = counted + 1
  if m == nil then
    local r = read_job(q, id, 'm')
    m = r and r[1] or false
  end
  local task, fp = nil, nil
  if m then task, fp = body_key(m, at or 1) end
  if not task then task, fp = '', '' end  -- bytes typedq did not write: no task
  local by_fp = tally[task]
  if not by_fp then by_fp = {}; tally[task] = by_fp end
  by_fp[fp] = (by_fp[fp] or 0) + 1
end

local sbyte, ssub, sfind = string.byte, string.sub, string.find
-- Counting: take the job whose body ends `entry` from offset `at` (a waiting entry,
-- a job string). The usual body, [task (fixstr), payload (bin 8), fingerprint
-- (fixstr), ...] (3 fields; more with a priority, a delay, limit keys: the fields
-- after the fingerprint are not read) or [task, payload] without a fingerprint, is
-- read here in a few byte reads (each call of a string function costs ~1k
-- instructions: a fifth of a job's count went to body_key's); any other through take.
local function take_entry_body(id, entry, at)
  local h, t = sbyte(entry, at, at + 1)
  if skip == 0 and h and h >= 0x92 and h <= 0x9f and t and t >= 0xa0 and t <= 0xbf then
    local pb = at + 2 + t - 0xa0  -- the payload's header
    local bh, bl = sbyte(entry, pb, pb + 1)
    if bh == 0xc4 and bl then
      local fpos, fp = pb + 2 + bl, nil
      if h == 0x92 then
        if fpos == #entry + 1 then fp = '' end
      else
        local fh = sbyte(entry, fpos)
        local fe = fh and fpos + fh - 0xa0  -- where the fingerprint ends
        if fh and fh >= 0xa0 and fh <= 0xbf
            and (fe == #entry or (h > 0x93 and fe < #entry)) then
          fp = ssub(entry, fpos + 1, fe)
        end
      end
      if fp then
        counted = counted + 1
        local task = ssub(entry, at + 2, pb - 1)
        local by_fp = tally[task]
        if not by_fp then by_fp = {}; tally[task] = by_fp end
        by_fp[fp] = (by_fp[fp] or 0) + 1
        return
      end
    end
  end
  take(id, entry, at)
end
-- True when the page is full or the budget spent: stop after the entry just examined.
local function done()
  return (counting and counted or #out) >= limit or budget <= 0
end
-- How many entries to read next (LRANGE, ZRANGE): those the page still needs if each is
-- one to take, at least 16, at most CHUNK. A page of 500 read 1000 entries and
-- examined half: each entry read costs its copy into Lua.
local function chunk()
  return math.min(CHUNK, math.max(16, limit - (counting and counted or #out) + skip))
end
-- The reply: `at` is the cursor to go on from ('' at the end of the state).
local function reply_at(at)
  local reply = {at, string.format('%d', skip)}
  if counting then
    reply[3] = string.format('%d', counted)
    for task, by_fp in pairs(tally) do
      for fp, n in pairs(by_fp) do
        reply[#reply + 1] = task
        reply[#reply + 1] = fp
        reply[#reply + 1] = string.format('%d', n)
      end
    end
    return reply
  end
  for _, id in ipairs(out) do reply[#reply + 1] = id end
  return reply
end
local function answer(at_end)
  return reply_at(at_end and '' or string.format('%d', pos))
end
-- A bare or gate entry's job `id` read for take: its state, queue, level (and body,
-- when counting); nil when it has no key.
local function read_taken(id)
  if counting then return read_keyed(q, id, 's', 'q', 'p', 'm') end
  return read_keyed(q, id, 's', 'q', 'p')
end
-- Counting: is job `id` of a sorted set in state `s`, and its body and where it starts
-- in the value read. read_job's answer in one or two commands, not its TYPE first: a
-- scheduled job not claimed yet is a job string (GET; its record's fields as
-- parse_rec reads them), any other job of a sorted set a hash (HMGET); a job without
-- a key would be a waiting entry job, in no sorted set.
local function ours_counting(id, s)
  local jk = k_job(q, id)
  if s == 's' then
    local v = rpcall('GET', jk)
    if type(v) == 'string' then
      local st, at = string.match(v, '^([ws])[^|]*|%d+|%d+|%-?%d*|%d*|()')
      return st == s, v, at
    end
    if not v then return false end
  end
  local r = rpcall('HMGET', jk, 's', 'm')
  if type(r) == 'table' and not r.err then return r[1] == s, r[2], 1 end
  local v = rpcall('GET', jk)  -- a job string in another state than expected
  if type(v) ~= 'string' then return false end
  return string.match(v, '^([ws])') == s, v, string.match(v, '^[ws][^|]*|%d+|%d+|%-?%d*|%d*|()')
end
-- Is job `id` in state `s`? (Counting: its body and offset too, ours_counting.)
local function ours(id, s)
  if counting then return ours_counting(id, s) end
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
  local cmd = rev and 'ZREVRANGE' or 'ZRANGE'
  while true do
    local want = chunk()
    -- Scores only while passing the ties of a cursor's departed entry (each score is
    -- a double formatted for the reply, ~4k instructions); the place a page stops at
    -- reads its own (ZSCORE).
    local rows, step = nil, 1
    if tie_score then
      rows, step = redis.call(cmd, key, at, at + want - 1, 'WITHSCORES'), 2
    else
      rows = redis.call(cmd, key, at, at + want - 1)
    end
    -- Counting scheduled jobs: their job strings read in one MGET (nil for a hash:
    -- a job claimed before, retrying), ~3k instructions less each than a GET apiece.
    local strings = nil
    if counting and s == 's' and #rows > 0 then
      local keys, jp = {}, k_job(q, '')
      for i = 1, #rows, step do keys[#keys + 1] = jp .. rows[i] end
      strings = redis.call('MGET', unpack(keys))
    end
    for i = 1, #rows, step do
      local id = rows[i]
      at = at + 1
      local passed = tie_score and tonumber(rows[i + 1]) == tie_score
        and (id == tie_id or before(id, tie_id) ~= (rev and true or false))
      if not passed then
        tie_score = nil  -- past the ties: every later entry is after the place
        budget = budget - 1
        local v = strings and strings[(i + step - 1) / step]
        if v then
          -- A job string 's|<order>|<enqueued_at>|<priority>|<run_at>|<body>' (see
          -- ours_counting; the letter may be followed by a queue name): its body
          -- after the fifth '|', found by plain searches (a pattern costs more).
          if sbyte(v, 1) == 115 then
            local b1 = sfind(v, '|', 2, true)
            local b2 = b1 and sfind(v, '|', b1 + 1, true)
            local b3 = b2 and sfind(v, '|', b2 + 1, true)
            local b4 = b3 and sfind(v, '|', b3 + 1, true)
            local b5 = b4 and sfind(v, '|', b4 + 1, true)
            if b5 then take_entry_body(id, v, b5 + 1) end
          end
        else
          local mine, m, from = ours(id, s)
          if mine then take(id, m or false, from) end
        end
        if done() then return reply_at(redis.call('ZSCORE', key, id) .. '|' .. id) end
      end
    end
    if #rows < step * want then return reply_at('') end
  end
end
if limit == 0 then return reply_at(cur) end

-- Walks one list in claim order (its tail first) from list position `pos - base`,
-- calling `visit(entry)` per entry; answers true when the walk must stop here.
local function walk(lk, base, len, visit)
  while pos < base + len do
    local c = pos - base  -- claim-order index: list index len - 1 - c
    local n = math.min(chunk(), base + len - pos)
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

-- Counting, every entry vouched for (`fast` below): walk's walk of one level list, a
-- waiting entry '<id>|<order>|<enqueued_at>|<run_at>|<body>' counted by its body read
-- in place (take_entry_body), with no liveness check (no id or order cut out, no
-- index bucket's SHA1, no HGET); a bare id through `visit`. The entry is checked
-- inline, not by a function of its own (a Lua call per entry costs ~600 instructions:
-- callgrind).
local function walk_fast(lk, base, len, visit)
  while pos < base + len do
    local c = pos - base
    local n = math.min(chunk(), base + len - pos)
    local entries = redis.call('LRANGE', lk, len - c - n, len - 1 - c)
    for i = #entries, 1, -1 do
      local entry = entries[i]
      pos = pos + 1
      budget = budget - 1
      local a = sfind(entry, '|', 2, true)
      local b = a and sfind(entry, '|', a + 1, true)
      local c3 = b and sfind(entry, '|', b + 1, true)
      local d = c3 and sfind(entry, '|', c3 + 1, true)
      if d then
        take_entry_body(false, entry, d + 1)
      else
        visit(entry)  -- a bare id
      end
      if counted >= limit or budget <= 0 then return true end
    end
    if #entries < n then pos = base + len end  -- the list shrank meanwhile
  end
  return false
end

if state == 'w' then
  -- The lists in claim order: the levels, then the gates; each {key, length, level
  -- (false for a gate), position of its first entry, gate}.
  local lists, total = {}, 0
  for _, prio in ipairs(redis.call('ZRANGE', k_levels(q), 0, -1)) do
    local lk = k_wait(q, prio)
    if redis.call('TYPE', lk).ok == 'list' then
      local len = redis.call('LLEN', lk)
      lists[#lists + 1] = {lk, len, prio, total}
      total = total + len
    end
  end
  -- Fair keys' lanes (typedq.fair; their markers in the levels list nothing), lane by
  -- lane: each key's jobs in its claim order.
  local lanes = redis.call('HKEYS', k_lanes(q))
  table.sort(lanes)
  for _, lane in ipairs(lanes) do
    local prio, group = string.match(lane, '^(%-?%d+)|(.+)$')
    local lk = prio and k_lane(q, group, prio)
    local len = lk and redis.call('LLEN', lk) or 0
    if len > 0 then
      lists[#lists + 1] = {lk, len, prio, total}
      total = total + len
    end
  end
  -- The waiting jobs a limit gate parked (typedq.limits), gate by gate, each gate's in
  -- the order it gives them back.
  local gates = redis.call('ZRANGE', k_gates(q), 0, 999)
  for _, gate in ipairs(gates) do
    local lk = k_gate(q, gate)
    local len = redis.call('LLEN', lk)
    if len > 0 then
      lists[#lists + 1] = {lk, len, false, total, gate}
      total = total + len
    end
  end
  -- Counting: every entry vouched for (`fast`) when the lists hold exactly as many
  -- entries as the queue has waiting jobs (its count, Q n). Each waiting job has an
  -- entry of its own there (an entry job its live entry, a job with a key its bare id
  -- or its gate's entry), so no entry is left over: none is stale, none removed ('|').
  -- A waiting entry is then its job's live one, read with no index lookup (its
  -- bucket's SHA1 and HGET: a third of a job's count). Stale or removed entries
  -- (cancel, remove, hand-backs) make the lists longer, and the walk checks each entry
  -- as it always did until claims have popped them; so do fair lanes (their markers in
  -- the level lists name no job) and gates past the 1,000 read here. Decided per call,
  -- so each call's counts hold for the instant it ran.
  local fast = counting and skip == 0 and #lanes == 0 and #gates < 1000
    and total == (tonumber(redis.call('HGET', k_counts(q), 'w')) or 0)
  if fast then limit, budget = asked, asked + BUDGET end
  -- The job id an entry names (nil for a removed entry).
  local function entry_id(entry, level)
    if not level then return string.match(entry, '^%-?%d+|(.+)$') end
    if is_bare(entry) then return entry end
    if string.byte(entry, 1) == 126 then return nil end  -- a fair key's marker
    return string.match(entry, '^([^|]+)|')
  end
  -- Calls f(position, entry, list) for the entries at positions [lo, hi), in order,
  -- until f answers true.
  local function span(lo, hi, f)
    for _, l in ipairs(lists) do
      local b, len = l[4], l[2]
      local from, to = math.max(lo, b), math.min(hi, b + len)
      if from < to then
        local entries = redis.call('LRANGE', l[1], len - (to - b), len - 1 - (from - b))
        for i = #entries, 1, -1 do
          if f(from + #entries - i, entries[i], l) then return end
        end
      end
    end
  end
  -- A cursor '<position>|<id>' also names the job whose entry was at that position
  -- ('<position>|<id>|g<gate>' in a gate's list): claims (from the head), hand-backs
  -- (to the head) and emptied levels move entries, so the page goes on from that
  -- entry's place now, the one nearest the position.
  local anchor, in_gate = string.match(cur, '^%d+|([^|]+)(.*)$')
  local anchor_gate = in_gate and string.match(in_gate, '^|g(.+)$')
  if anchor then
    local found, seen = nil, false
    span(pos, pos + 1, function(p, entry, l)
      seen = entry_id(entry, l[3]) == anchor
      return true
    end)
    if seen then found = pos else
      span(math.max(0, pos - WINDOW), pos + WINDOW + 1, function(p, entry, l)
        if entry_id(entry, l[3]) == anchor
            and (not found or math.abs(p - pos) < math.abs(found - pos)) then
          found = p
        end
      end)
    end
    if found then
      pos = found
    else
      -- Not near its place. Claimed since (active, finished or due again later): the
      -- jobs before it in its level (its gate) were claimed before it, so go on from
      -- the start of its level or gate (or where the level would be).
      local r = read_job(q, anchor, 's', 'p')
      if r and r[1] ~= 'w' and r[1] ~= 'x' and anchor_gate then
        for _, l in ipairs(lists) do
          if l[5] == anchor_gate then
            pos = math.min(pos, l[4])
            break
          end
        end
      elseif r and r[1] ~= 'w' and r[1] ~= 'x' then
        local prio = tonumber(sane_prio(r[2]) or '0') or 0
        for _, l in ipairs(lists) do
          if not l[3] or tonumber(l[3]) <= prio then
            pos = math.min(pos, l[4])
            break
          end
        end
      end
    end
  end
  -- The cursor after a page: the position of the next entry that names a job (removed
  -- entries between are never listed) and that job's id.
  local function stop_here()
    local at = nil
    local function named(p, entry, l)
      local id = entry_id(entry, l[3])
      if id then at = string.format('%d|%s', p, id) .. (l[3] and '' or '|g' .. l[5]) end
      return id ~= nil
    end
    span(pos, pos + 8, named)  -- usually the very next entry
    if not at then span(pos + 8, pos + CHUNK, named) end
    return reply_at(at or string.format('%d', pos))
  end
  local sk = k_stale(q)
  for _, l in ipairs(lists) do
    local lk, len, prio, base = l[1], l[2], l[3], l[4]
    if pos < base + len then
      local visit
      -- Counting: a waiting entry's live value in the index (entry_live's), and the
      -- index's prefix, made once per list, not per entry.
      local ix, tail = k_idx_prefix(q), (prio and prio ~= '0') and ('|' .. prio) or ''
      if prio then
        visit = function(entry)
          if counting then
            -- A waiting entry '<id>|<order>|<enqueued_at>|<run_at>|<body>' read in
            -- place: its id, order and where its body starts, found by plain searches
            -- for '|' (string.match's pattern walked the entry at ~200 instructions a
            -- byte: a third of the call's cost). Live when the index holds its order
            -- (entry_live); a bare id or a removed entry ('|') has no fourth '|'.
            local a = string.find(entry, '|', 1, true)
            local b = a and a > 1 and string.find(entry, '|', a + 1, true)
            local c = b and string.find(entry, '|', b + 1, true)
            local d = c and string.find(entry, '|', c + 1, true)
            if d then
              local id = string.sub(entry, 1, a - 1)
              local o = string.sub(entry, a + 1, b - 1)
              if rcall('HGET', idx_bucket(id, ix), id) == (tail == '' and o or o .. tail)
              then
                take_entry_body(id, entry, d + 1)
              end
              return
            end
          end
          if not is_bare(entry) then
            -- A waiting entry (see keys.py): listed while live.
            local f = parse_entry(entry)
            if f and entry_live(q, prio, f) then take(f.id, f.m) end
          else
            local r = read_taken(entry)
            -- With a stale count, the newest bare entry of the id is live unless the
            -- job is parked (its live entry is then in a gate's list).
            if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == prio
                and (not redis.call('HGET', sk, prio .. '|' .. entry)
                  or (redis.call('LPOS', lk, entry) == len - (pos - base)
                    and redis.call('HEXISTS', k_parked(q), entry) == 0)) then
              take(entry, r[4])
            end
          end
        end
      else
        visit = function(entry)
          local gp, id = string.match(entry, '^(%-?%d+)|(.*)$')
          local r = gp and read_taken(id)
          -- With a stale count (a job of this id was cancelled or removed while parked,
          -- and one may wait again under the id), an entry is live only if the job is
          -- parked now in this gate (the queue's parked hash) and it is the newest of the
          -- id in the gate (stale ones precede it there).
          if r and r[1] == 'w' and r[2] == q and sane_prio(r[3]) == gp
              and (not redis.call('HGET', sk, gp .. '|' .. id)
                or (redis.call('HGET', k_parked(q), id) == l[5]
                  and redis.call('LPOS', lk, entry) == len - (pos - base))) then
            take(id, r[4])
          end
        end
      end
      if fast and prio then
        if walk_fast(lk, base, len, visit) then return stop_here() end
      elseif walk(lk, base, len, visit) then return stop_here() end
    end
  end
  return answer(true)
elseif state == 's' then
  return zwalk(k_sched(q), false, 's')
elseif state == 'a' and counting then
  return zwalk(k_active(q), false, 'a')
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
