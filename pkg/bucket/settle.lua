-- allot: settle a take after the fact (bucket/settle.go): take the difference between the
-- actual cost and the estimate from every bucket of one identity, or give it back, in one
-- atomic step on the identity's shard; with a marker, only if the marker is there, which
-- is deleted in the same step, so a settlement happens once however many arrive.
--
-- The bucket math is bucket.Limit.TokensAt and bucket.Limit.Settle, in the same
-- floating-point operations in the same order as the Go (TestRedisSettleMatchesGo).
--
-- KEYS[i]      bucket i (i = 1..n), as redis.lua stores it
-- KEYS[n+1]    the marker "<estimate> <cost>", when ARGV[1] is 'm'
-- ARGV[1]      'm': ARGV[2] is the actual amount, and the delta is actual × cost −
--              estimate, read from the marker; 'd': ARGV[2] is the delta itself
-- ARGV[1+2i]   rate of bucket i; ARGV[2+2i] its burst
--
-- Reply: {1, delta, limiting (0-based), remaining} or {0, 0, 0, 0} when the marker is not
-- there (nothing changed). remaining is the whole tokens of the lowest bucket after,
-- negative in debt. A delta of 0 writes nothing.

local eps = 1e-9
local maxwait = 1e15 -- bucket.MaxWaitMicros

local n = #KEYS
local delta
if ARGV[1] == 'm' then
  n = n - 1
  local v = redis.call('GET', KEYS[n + 1])
  if not v then
    return {0, 0, 0, 0}
  end
  local sp = string.find(v, ' ', 1, true)
  local est = sp and tonumber(string.sub(v, 1, sp - 1))
  local cost = sp and tonumber(string.sub(v, sp + 1))
  redis.call('DEL', KEYS[n + 1])
  if not (est and cost) then
    return {0, 0, 0, 0}
  end
  delta = tonumber(ARGV[2]) * cost - est
  -- bucket.maxDelta: a bucket in [-burst, burst] ends the same past it, and the reply
  -- stays an exact integer
  if delta > 2e12 then
    delta = 2e12
  elseif delta < -2e12 then
    delta = -2e12
  end
else
  delta = tonumber(ARGV[2])
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local vals = redis.call('MGET', unpack(KEYS, 1, n))

local lim, best = 1, math.huge
for i = 1, n do
  local r = tonumber(ARGV[1 + 2 * i])
  local b = tonumber(ARGV[2 + 2 * i])
  local x, l = b, now
  local v = vals[i]
  if v then
    local sp = string.find(v, ' ', 1, true)
    local st = sp and tonumber(string.sub(v, 1, sp - 1))
    local sl = sp and tonumber(string.sub(v, sp + 1))
    if st and sl then
      local elapsed = now - sl
      if elapsed < 0 then
        elapsed = 0
        l = sl
      end
      x = st + elapsed * r / 1e6
      if x > b then
        x = b
      end
    end
  end
  if delta ~= 0 then
    -- bucket.Limit.Settle
    x = x - delta
    if x > b then
      x = b
    end
    if x < -b then
      x = -b
    end
    -- bucket.Limit.FullAfterMicros, and redis.lua's expiry
    local full = 1
    if x + eps < b then
      full = math.ceil((b - x) * 1e6 / r)
      if full > maxwait then
        full = maxwait
      end
      if full < 1 then
        full = 1
      end
    end
    local ms = math.ceil((l - now + full) / 1000) + 1
    redis.call('SET', KEYS[i], string.format('%.17g %.0f', x, l), 'PX', string.format('%.0f', ms))
  end
  if x < best then
    lim, best = i, x
  end
end
return {1, delta, lim - 1, math.floor(best + eps)}
