#!lua flags=no-writes
-- For tests only: the key names common.lua derives, to check them against keys.py.
-- ARGV: P, queue, priority, id, request token[, gate, task, limit key[, minute]]
local out = {k_job(ARGV[4]), k_levels(ARGV[2]), k_wait(ARGV[2], ARGV[3]), k_sched(ARGV[2]),
  k_counts(ARGV[2]), k_stale(ARGV[2]), k_req(ARGV[5]), CH_WORK, CH_DONE, CH_CANCEL}
if #ARGV >= 8 then
  out[#out + 1] = k_gates(ARGV[2])
  out[#out + 1] = k_gate(ARGV[2], ARGV[6])
  out[#out + 1] = k_rate(ARGV[7], ARGV[8])
  out[#out + 1] = k_slots(ARGV[7] .. '|' .. ARGV[8])
end
if #ARGV >= 9 then out[#out + 1] = k_minute(ARGV[2], ARGV[9]) end
out[#out + 1] = k_events(ARGV[2])
out[#out + 1] = k_events_cfg(ARGV[2])
return out
