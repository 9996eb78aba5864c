#!lua flags=no-writes
-- Which of the given jobs of one queue are active with a pending cancel request.
-- KEYS[1] = the queue's active zset
-- ARGV: P, queue, ids...
local q = ARGV[2]
local out = {}
for i = 3, #ARGV do
  local r = read_hash(q, ARGV[i], 's', 'cr')
  if r and r[1] == 'a' and r[2] then out[#out + 1] = ARGV[i] end
end
return out
