-- allot: a region's fenced enforcers (bucket.Fences), in one atomic step.
--
-- KEYS[1]   the marks: a sorted set of enforcer id → Unix ms of its last mark
-- ARGV[1]   the calling enforcer's id ("" only counts)
-- ARGV[2]   "1": it marks itself fenced; "0": it takes its mark back (if any)
-- ARGV[3]   how long a mark counts, ms
-- ARGV[4]   the most ids kept (bucket.MaxFences)
-- ARGV[5]   now, Unix ms; 0 means the server's clock (TIME). Callers pass 0 unless a test
--           injects a clock (bucket.RedisOptions.Clock).
--
-- Forgets the marks older than the window, adds or removes ARGV[1]'s, keeps the newest
-- ARGV[4] and lets the set expire a window after its newest mark. Reply: the ids marked
-- within the window.

local k = KEYS[1]
local id, fenced = ARGV[1], ARGV[2]
local ttl, most, now = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%.0f', now - ttl))
if id ~= '' and fenced == '0' then
  redis.call('ZREM', k, id)
elseif id ~= '' then
  redis.call('ZADD', k, string.format('%.0f', now), id)
  redis.call('ZREMRANGEBYRANK', k, 0, -(most + 1))
  redis.call('PEXPIRE', k, ttl)
end
return redis.call('ZCARD', k)
