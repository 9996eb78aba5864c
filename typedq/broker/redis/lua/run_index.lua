#!lua
-- The app's index of durable runs (P runs: run id -> its queue), on the app's slot:
-- each run id not indexed yet is indexed on the queue given; answers every id's queue
-- (the given one, or the one a run created before under that id is on).
-- KEYS[1] = P runs
-- ARGV: P, then per run: id, queue
-- Returns per run its queue.
if #ARGV < 1 or (#ARGV - 1) % 2 ~= 0 then return bad_args('run_index') end
local out = {}
for i = 2, #ARGV, 2 do
  rcall('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  out[#out + 1] = rcall('HGET', KEYS[1], ARGV[i])
end
return out
