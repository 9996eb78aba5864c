-- common/flows.lua: Workflows: the flow record, step ids, msgpack helpers, span links, the outbox.
-- (A part of the shared prelude, in the order of scripts.py's PARTS: README.md.)
-- Workflows (typedq/broker/flow.py). A flow F keeps, while it runs, the hash f:<F> on
-- the queue of its own job (`fq`): S steps, n members, c members not settled, col '1'
-- when the last step is a collector, pol 'c' for the collecting fan-in, mq/sq the
-- members' and steps' queues (space-separated, or one name when all share it); per
-- member i: r<i> once it settled (its fan-in element); fi/fst/fe: the first failed
-- member (index, state, record). Member i is the job F.m<i>, step k is F.<k>, the last
-- step is F itself. A held step is scheduled at HELD_US with its body split around the
-- payload (mh, mt). Every job of a flow holds fl (F) and fq.
-- HELD_US and FLOW_BROKEN (generated from the Python value: constants.py).
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
-- MAX_SPAN_LINKS (generated from the Python value: constants.py).
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
-- jobs on the target queue; {'a', F, fq, n, ids...} start the flow's steps on the target
-- queue (the first n move to waiting, the rest stay held), stored pending by
-- flow_part.lua; {'A', F, fq, from, to, mode} start (mode 'd': drop) the flow's pending
-- members F.m<from> .. F.m<to - 1> on the target queue (one bounded chunk per entry:
-- flow_ops.start_range); {'D', F, fq, ids...} drop pending jobs of a flow its root refused;
-- {'Z', F, fq, entry id} the next step of a flow's end (flow_settle.lua's flow_end: on
-- one Redis too, from the flow's root to itself).
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

-- flow_ops (declared in common/bookkeeping.lua): flow_ops.outbox_due here.

-- The reaper: hand back up to `limit` entries of queue q's outbox written `age` µs or
-- more ago (their writer died before it applied them, or its apply failed).
function flow_ops.outbox_due(q, now, age, limit)
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

