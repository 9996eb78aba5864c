#!lua flags=no-writes
-- Which of the given jobs are active with a pending cancel request.
-- ARGV: P, ids...
local out = {}
for i = 2, #ARGV do
  local r = read_hash(ARGV[i], 's', 'cr')
  if r and r[1] == 'a' and r[2] then out[#out + 1] = ARGV[i] end
end
return out
