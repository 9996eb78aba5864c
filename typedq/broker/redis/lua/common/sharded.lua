-- Redis Cluster only: scripts.py puts this part after common/bookkeeping.lua (see README.md),
-- so these wake-ups replace the ones above for every later use. Each queue has its own
-- channels in its own slot (qch); SPUBLISH reaches only the shard that holds the queue.
local done_by_q = {}
local function note_done(q, id)
  local t = done_by_q[q]
  if not t then t = {}; done_by_q[q] = t end
  t[#t + 1] = id
end
local function publish_cancel(q, id) rcall('SPUBLISH', qch(q, 'x'), id) end
-- Another queue may be on another slot (two queues sharing one by chance still go
-- through the outbox, as flows do).
local function run_away(q, rq) return q ~= rq end
local function publish()
  for q, ids in pairs(done_by_q) do rcall('SPUBLISH', qch(q, 'd'), table.concat(ids, ' ')) end
  -- Only where a waiter mark was consumed (see common/bookkeeping.lua's publish).
  for q in pairs(work_queues) do
    if rcall('DEL', k_waiter(q)) == 1 then
      rcall('SPUBLISH', qch(q, 'w'), q)
      wake_handoffs(q)
    end
  end
end
