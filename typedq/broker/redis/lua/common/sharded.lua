-- Redis Cluster only: scripts.py puts this part after common/bookkeeping.lua (see README.md),
-- and it assigns new wake-ups to bookkeeping's helpers (no new top-level local: the main
-- chunk holds at most 200, README.md). Nothing before this part calls them, so every use
-- gets these. Each queue has its own channels in its own slot (qch); SPUBLISH reaches only
-- the shard that holds the queue. `done_ids` holds queue -> ids here (a list of ids on
-- one Redis).
note_done = function(q, id)
  local t = done_ids[q]
  if not t then t = {}; done_ids[q] = t end
  t[#t + 1] = id
end
publish_cancel = function(q, id) rcall('SPUBLISH', qch(q, 'x'), id) end
-- Another queue may be on another slot (two queues sharing one by chance still go
-- through the outbox, as flows do).
run_away = function(q, rq) return q ~= rq end
publish = function()
  for q, ids in pairs(done_ids) do rcall('SPUBLISH', qch(q, 'd'), table.concat(ids, ' ')) end
  -- Only where a waiter mark was consumed (see common/bookkeeping.lua's publish).
  for q in pairs(work_queues) do
    if rcall('DEL', k_waiter(q)) == 1 then
      rcall('SPUBLISH', qch(q, 'w'), q)
      wake_handoffs(q)
    end
  end
end
