#!lua flags=no-writes
-- For tests only (tests/redis/test_redis_broker.py builds a library of the shared parts and
-- this file): the key names common/keys.lua derives, to check them against keys.py.
-- ARGV: P, queue, priority, id, request token[, gate, task, limit key[, minute]]
local q = ARGV[2]
local out = {k_job(q, ARGV[4]), k_levels(q), k_wait(q, ARGV[3]), k_sched(q),
  k_counts(q), k_stale(q), k_req(q, ARGV[5]), CH_WORK, CH_DONE, CH_CANCEL,
  k_active(q), k_done(q, 'c'), k_done(q, 'f'), k_done(q, 'x'), k_seq(q), k_qepoch(q),
  k_flow(q, ARGV[4]), k_worker(ARGV[4]), k_idx(q, ARGV[4])}
if #ARGV >= 8 then
  out[#out + 1] = k_gates(q)
  out[#out + 1] = k_gate(q, ARGV[6])
  out[#out + 1] = k_rate(q, ARGV[7], ARGV[8])
  out[#out + 1] = k_slots(q, ARGV[7] .. '|' .. ARGV[8])
end
if #ARGV >= 9 then out[#out + 1] = k_minute(q, ARGV[9]) end
out[#out + 1] = k_events(q)
out[#out + 1] = k_events_cfg(q)
out[#out + 1] = qch(q, 'w')
out[#out + 1] = qch(q, 'd')
out[#out + 1] = qch(q, 'x')
out[#out + 1] = k_outbox(q)
out[#out + 1] = k_handoff(q, ARGV[4] .. '|m')
out[#out + 1] = k_waiter(q)
out[#out + 1] = k_run(q, 'u:', ARGV[4])
out[#out + 1] = k_run(q, 'ul:', ARGV[4])
out[#out + 1] = k_run(q, 'uo:', ARGV[4])
out[#out + 1] = k_run(q, 'uS:', ARGV[4])
out[#out + 1] = k_run(q, 'us:', ARGV[4] .. '|sig')
out[#out + 1] = k_run(q, 'ud:', 'c')
out[#out + 1] = k_unique(q, 't1|k:1')
out[#out + 1] = k_unique_job(q, ARGV[4])
out[#out + 1] = k_debounce(q, 't1|k:1')
out[#out + 1] = k_jstream(q, ARGV[4])
out[#out + 1] = k_lane(q, 't1|k:1', ARGV[3])
out[#out + 1] = k_lanes(q)
out[#out + 1] = k_lanes(q, true)
out[#out + 1] = flow_ops.staged(q, ARGV[4])
out[#out + 1] = flow_ops.releasing(q)
return out
