#!lua flags=allow-oom
-- Release the next members of a large fan-out stored with its members staged
-- (flow_enqueue with staged members; common/flow_settle.lua's flow_ops.release): up to
-- `limit` of them, in input order, become waiting jobs. Calling it again once all are
-- released (a re-sent call, the reaper first) changes nothing.
-- KEYS[1] = the members' queue's order counter
-- ARGV: P, members' queue q, queue of the flow's own job fq, flow id F, limit
-- Returns how many members are still staged (0: all released, or the flow has ended).
local q, fq, f, limit = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if #ARGV ~= 5 or q == '' or fq == '' or f == '' or not is_int(limit) or limit < 1 then
  return bad_args('flow_open')
end
local left = flow_ops.release(q, fq, f, limit, now_us())
flush_counts()
publish()
return flow_reply(left)
