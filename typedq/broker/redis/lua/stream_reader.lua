#!lua
-- A reader of a job's stream joins (or stays in) or leaves the stream's readers
-- (typedq/broker/redis/streams.py; counted by flow_keys.lua): the sorted set Q jr:<id>,
-- member the reader's id, score when it stops counting (ms, the Redis clock). A reader
-- refreshes its entry every few seconds while it reads; one that died drops out when its
-- score passes (the members past theirs go at the next join; the set expires with its
-- last member). Never touched by the emit path.
-- KEYS[1] = the stream's readers (Q jr:<id>)
-- ARGV: P, reader id, ttl (ms; '0': leave)
if #ARGV ~= 3 or ARGV[2] == '' or not string.match(ARGV[3], '^%d+$') then
  return bad_args('stream_reader')
end
local rk, reader, ttl = KEYS[1], ARGV[2], tonumber(ARGV[3])
if ttl == 0 then
  redis.call('ZREM', rk, reader)
  return 0
end
local now_ms = math.floor(now_us() / 1000)
redis.call('ZREMRANGEBYSCORE', rk, '-inf', now_ms)
redis.call('ZADD', rk, now_ms + ttl, reader)
if redis.call('PTTL', rk) < ttl then redis.call('PEXPIRE', rk, ttl) end
return 1
