#!lua
-- Record task schemas (typedq.broker.schemas): the first record of each field stays,
-- stamped with the Redis clock. Returns 1 per pair recorded now, 0 per pair kept before.
-- KEYS[1] = schemas (hash '<task>|<fingerprint>' -> '<first seen µs>|<record>')
-- ARGV: P, then (field, record) pairs
now_us()
local now = last_now_text
local out = {}
for i = 2, #ARGV - 1, 2 do
  out[#out + 1] = rcall('HSETNX', KEYS[1], ARGV[i], now .. '|' .. ARGV[i + 1])
end
return out
