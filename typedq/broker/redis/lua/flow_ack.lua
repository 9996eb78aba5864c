#!lua flags=allow-oom
-- Delete applied entries from a queue's outbox (flows across slots, see common/flows.lua).
-- KEYS[1] = the queue's outbox
-- ARGV: P, queue, entry ids...
-- Returns how many were still there.
local q = ARGV[2]
if #ARGV < 2 or not q or q == '' then return bad_args('flow_ack') end
local gone = 0
for i = 3, #ARGV do
  gone = gone + redis.call('ZREM', k_outbox(q), ARGV[i])
  redis.call('DEL', k_handoff(q, ARGV[i]))
end
return gone
