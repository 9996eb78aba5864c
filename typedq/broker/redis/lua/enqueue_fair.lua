#!lua
-- enqueue.lua for a batch that holds fair jobs (typedq.fair; the producer picks this
-- script only then, so enqueue.lua's path stays as it is): the same arguments and
-- answer; a fair job due now is stored as a job string and its id goes to its key's
-- lane (common/lanes.lua lane_push), every other job as enqueue.lua stores it.
-- Store a batch of jobs: a waiting job as its entry in its level list and its id in
-- the queue's index, a scheduled one as one job string (see keys.py); an existing id is
-- not replaced (created = 0), and a repeated id in the batch is stored once (its
-- first occurrence). max_queue_length counts only the jobs this call creates.
-- Refused at maxmemory (no allow-oom flag): enqueues are what fills Redis.
-- A re-sent call (same request record: lost reply, client retry) returns the first
-- copy's answer, so the jobs it created still answer created = 1.
-- KEYS[1] = the first job's queue's order counter, KEYS[2] = this call's request record
-- (on that queue's slot). On Redis Cluster every job of a call is of one queue.
-- Each queue's order counter numbers its own jobs.
-- ARGV: P, max_queue_length, n, then n x (id, queue, priority, eta_us, delay_us, body),
--   or, when every job of the call has the same queue, priority, eta and delay (a bulk
--   enqueue: the usual case), P, max_queue_length, n, '', queue, priority, eta_us,
--   delay_us, then n x (id, body): two arguments per job instead of six ('' in place of
--   the first id tells the forms apart: an id is never empty).
local limit, n = tonumber(ARGV[2]), tonumber(ARGV[3])
local shared = ARGV[4] == ''
-- Job i's arguments start at ARGV[first + stride * i]: its id, then (one per job) its
-- queue, priority, eta, delay, then its body at + body_at.
local first, stride, body_at = 4, 6, 5
if shared then first, stride, body_at = 9, 2, 1 end
if not limit or not is_int(n) or n < 0 or #ARGV ~= first - 1 + stride * n then
  return bad_args('enqueue_fair')
end
-- (A '0' is taken as it is: most jobs have priority, eta and delay 0, and every tonumber
-- of a string is a strtod. A queue name holds no '|': the job string's fields are
-- separated by it.)
-- The shared form's fields are looked at once (with its first job), then only its ids.
local checked = n - 1
if shared and n > 1 then checked = 0 end
for i = 0, checked do
  local b = first + stride * i
  local q, prio, eta, delay = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4]
  if shared then q, prio, eta, delay = ARGV[5], ARGV[6], ARGV[7], ARGV[8] end
  if ARGV[b] == '' or q == '' or string.find(q, '|', 1, true)
      or (prio ~= '0' and not is_int(prio)) or (eta ~= '0' and not tonumber(eta))
      or (delay ~= '0' and not tonumber(delay)) then
    return bad_args('enqueue_fair')
  end
end
if shared then
  for b = first + 2, #ARGV, 2 do
    if ARGV[b] == '' then return bad_args('enqueue_fair') end
  end
end
-- The one queue, priority, eta and delay of every job of the call (nil: each job has
-- its own): the shared form's, or the one job's (its arguments are at the same places).
-- With one queue, what is kept per queue below is a number, not a table per call.
local sq, sprio, seta, sdelay
if shared or n == 1 then sq, sprio, seta, sdelay = ARGV[5], ARGV[6], ARGV[7], ARGV[8] end

local prev = rpcall('GET', KEYS[2])
if type(prev) == 'string' and #prev == n then
  local again = {}
  for i = 1, n do again[i] = string.byte(prev, i) - 48 end
  return again
end

local now = now_us()
-- adding: queue -> its new jobs (several queues; with one, that is `fresh`).
local new, adding, fresh = {}, not sq and {}, 0
local seen = n > 1 and {}  -- (one job: no repeats to look for)
for i = 0, n - 1 do
  local b = first + stride * i
  local id, q = ARGV[b], sq or ARGV[b + 1]
  local key = seen and (sq and id or q .. '|' .. id)
  local ik = not (seen and seen[key]) and rcall('EXISTS', k_job(q, id)) == 0 and k_idx(q, id)
  if ik and rcall('HEXISTS', ik, id) == 0 then
    new[i] = ik  -- the id's index bucket (one SHA1 per job)
    fresh = fresh + 1
    if adding then adding[q] = (adding[q] or 0) + 1 end
  end
  if seen then seen[key] = true end
end
if limit > 0 then
  if sq then
    local full = fresh > 0 and queue_full(sq, fresh, limit)
    if full then return full end
  else
    for q, extra in pairs(adding) do
      local full = queue_full(q, extra, limit)
      if full then return full end
    end
  end
end

-- Validated: from here on, only writes.
-- The last order taken: per queue (orders), or of the one queue (order).
local orders, order = nil, 0
if sq then
  if fresh > 0 then order = rcall('INCRBY', k_seq(sq), num_text(fresh)) - fresh end
else
  orders = {}
  for q, extra in pairs(adding) do
    orders[q] = rcall('INCRBY', k_seq(q), num_text(extra)) - extra
  end
end
local out = {}
-- The waiting entries to push: of the one queue's one level (one_list), or per level
-- list (lists: list key -> entries; list_order: {list key, queue, priority} per list).
local one_list, lists, list_order = nil, nil, nil
if sq then one_list = {} else lists, list_order = {}, {} end
local now_text = last_now_text
for i = 0, n - 1 do
  local b = first + stride * i
  if new[i] then
    local id, q, prio, eta, delay = ARGV[b], sq, sprio, seta, sdelay
    if not shared then q, prio, eta, delay = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4] end
    local run_at = run_at_of(eta, delay, now)
    if orders then
      order = orders[q] + 1
      orders[q] = order
    else
      order = order + 1
    end
    if run_at > now then
      local f = {s = 's', q = q, o = order, e = now, p = prio ~= '0' and prio, r = run_at,
        m = ARGV[b + body_at]}
      rcall('SET', k_job(q, id), pack_rec(f))
      rcall('ZADD', k_sched(q), run_at, id)
      count(q, 's', 1)
    else
      local l = one_list
      if not l then
        local lk = k_wait(q, prio)
        l = lists[lk]
        if not l then
          l = {}
          lists[lk] = l
          list_order[#list_order + 1] = {lk, q, prio}
        end
      end
      local body = ARGV[b + body_at]
      local group, weight = fair_of(body)
      if group then
        -- The plain jobs before it in the call go first (their entries, then its marker):
        -- the call's order is the line's, as on the embedded broker.
        if #l > 0 then
          push_entries(q, prio, k_wait(q, prio), l)
          for k = #l, 1, -1 do l[k] = nil end
        end
        store_fair(q, prio, id, order, now, body, false, group, weight)
      else
        local o = int_text(order)
        l[#l + 1] = pack_entry(id, o, now_text, body)
        rcall('HSET', new[i], id, idx_val(o, prio))
      end
      count(q, 'w', 1)
    end
    work_queues[q] = true
    out[i + 1] = 1
  else
    out[i + 1] = 0
  end
end
if one_list then
  if #one_list > 0 then push_entries(sq, sprio, k_wait(sq, sprio), one_list) end
else
  for _, entry in ipairs(list_order) do
    push_entries(entry[2], entry[3], entry[1], lists[entry[1]])
  end
end
if fresh > 0 then rcall('SET', KEYS[2], table.concat(out), 'PX', REQ_TTL_MS) end
flush_counts()
publish()
return out
