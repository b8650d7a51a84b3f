-- allot: one in-flight limit's slots (bucket.Hold), in one atomic step on the identity's
-- shard. memory_inflight.go is the same step in Go; the conformance suite holds both to it.
--
-- KEYS[1]   the slots: a sorted set of handle → Unix ms it was admitted
-- ARGV[1]   "acquire", "release" or "oldest" (release the oldest slot)
-- ARGV[2]   the handle ("" for oldest)
-- ARGV[3]   the cap (acquire; else ignored)
-- ARGV[4]   the timeout, ms; 0 forgets nothing first (release only)
-- ARGV[5]   now, Unix ms; 0 means the server's clock (TIME). Callers pass 0 unless a test
--           injects a clock (bucket.RedisOptions.Clock).
--
-- Every step first forgets the slots admitted at or before now − timeout: a slot whose
-- release was lost comes back within the timeout. The set never holds more than the cap
-- (at most bucket.MaxConcurrent) and expires a timeout after its newest slot.
--
-- Reply: acquire {held 0|1, in flight after, retry-after ms}; release and oldest
-- {released 0|1, in flight after, 0}.

local k = KEYS[1]
local op, handle = ARGV[1], ARGV[2]
local cap, timeout, now = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if timeout > 0 then
  redis.call('ZREMRANGEBYSCORE', k, '-inf', string.format('%.0f', now - timeout))
end

if op == 'release' then
  local r = redis.call('ZREM', k, handle)
  return {r, redis.call('ZCARD', k), 0}
end
if op == 'oldest' then
  local r = redis.call('ZPOPMIN', k, 1)
  local n = 0
  if #r > 0 then
    n = 1
  end
  return {n, redis.call('ZCARD', k), 0}
end

local n = redis.call('ZCARD', k)
if redis.call('ZSCORE', k, handle) then
  return {1, n, 0} -- a retried acquire: admitted already
end
if n >= cap then
  local retry = timeout
  local o = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if #o == 2 then
    retry = tonumber(o[2]) + timeout - now
    if retry < 1 then
      retry = 1
    end
  end
  return {0, n, retry}
end
redis.call('ZADD', k, string.format('%.0f', now), handle)
redis.call('PEXPIRE', k, string.format('%.0f', timeout + 1))
return {1, n + 1, 0}
