#!lua
-- Compare-and-append to durable runs of one queue, as run_append.lua, for appends that
-- schedule steps: each append that is applied also stores the step jobs it names (a
-- waiting job each, handed straight to an idle worker when one is registered; an id
-- taken already stores nothing), in the same call, so a turn that schedules steps is
-- one round trip. The steps are on this slot (Redis Cluster: the run's own queue).
-- Refused at maxmemory (no allow-oom flag), as enqueue.lua is: the call stores nothing.
-- KEYS[1] = the queue's order counter
-- ARGV: P, queue, completed ttl (µs), completed max, failed ttl, failed max,
--   max_queue_length (0 none), then per append: k, k x (step id, its queue, its body),
--   then the append's arguments as run_append.lua takes them.
-- Returns {per append 'appended' | 'conflict' | 'finished' | 'not_found' | 'fenced', ids
-- dropped};
-- an error TYPEDQ_QUEUE_FULL (nothing stored) when the new steps would take a queue past
-- max_queue_length.
local q = ARGV[2]
local limit = tonumber(ARGV[7])
if #ARGV < 7 or q == '' or not limit then return bad_args('run_schedule') end
run_ops.bounds(ARGV[3], ARGV[4], ARGV[5], ARGV[6])
local now = now_us()

-- Read and checked before any write: per append where its steps and its own arguments
-- start, and the new steps per queue (max_queue_length counts only those).
local parts, adding = {}, {}
local a = 8
while a <= #ARGV do
  local k = tonumber(ARGV[a])
  if not k or a + 3 * k + 14 > #ARGV then return bad_args('run_schedule') end
  for s = a + 1, a + 3 * k, 3 do
    local sq = ARGV[s + 1]
    if ARGV[s] == '' or sq == '' or string.find(sq, '|', 1, true) then
      return bad_args('run_schedule')
    end
    if limit > 0 and not job_exists(sq, ARGV[s]) then adding[sq] = (adding[sq] or 0) + 1 end
  end
  local b = a + 3 * k + 1
  local n = tonumber(ARGV[b + 9])
  local m = n and tonumber(ARGV[b + 10 + n])
  if not m or b + 13 + n + m > #ARGV then return bad_args('run_schedule') end
  parts[#parts + 1] = {a, k, b}
  a = b + 14 + n + m
end
if limit > 0 then
  for sq, extra in pairs(adding) do
    local full = queue_full(sq, extra, limit)
    if full then return full end
  end
end

local out = {}
for _, p in ipairs(parts) do
  local got = run_ops.append(ARGV, p[3], q, now)
  if got == 'appended' then
    for s = p[1] + 1, p[1] + 3 * p[2], 3 do
      run_ops.enqueue(ARGV[s + 1], ARGV[s], ARGV[s + 2], 0, now)
    end
  end
  out[#out + 1] = got
end
return run_ops.answer(out)
