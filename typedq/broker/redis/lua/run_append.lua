#!lua flags=allow-oom
-- Compare-and-append to durable runs of one queue (typedq.broker.runs.RunAppend; the
-- embedded broker's RunStore.append is the reference): applied only while the run is
-- running and its log has the expected length. Then the run waits (jobs, a signal, a
-- timer; one already over wakes it at once) or ends.
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max, then per
--   append: run id, expected length, signal to take ('' none), state letter (r c f x),
--   result ('-' none, else '+' and the result), failure ('' none), wait jobs
--   (space-separated), wait signal ('' none), wake at (µs, '' none), n, n entries,
--   m, m recorded job ids, fence: job id ('' none), its token, its queue (this slot)
-- Returns {per append 'appended' | 'conflict' | 'finished' | 'not_found' | 'fenced', ids
-- dropped}.
local q = ARGV[2]
if #ARGV < 6 or q == '' then return bad_args('run_append') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()

local out = {}
local a = 7
while a <= #ARGV do
  if a + 13 > #ARGV then return bad_args('run_append') end
  local n = tonumber(ARGV[a + 9])
  local m = n and tonumber(ARGV[a + 10 + n])
  if not m or a + 13 + n + m > #ARGV then return bad_args('run_append') end
  out[#out + 1] = run_ops.append(ARGV, a, q, now)
  a = a + 14 + n + m
end
return run_ops.answer(out)
