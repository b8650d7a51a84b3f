-- allot: take between min and want tokens from every bucket of one identity at once, all
-- or nothing, in one atomic step on the identity's shard.
--
-- This is bucket.TokensAt and bucket.Decide (bucket.go) step for step, in the same
-- floating-point operations in the same order, so Redis and the memory store answer alike;
-- a change to one must be made to the other (TestRedisMatchesDecide checks they agree).
--
-- KEYS[i]      bucket i (i = 1..n): absent (full) or "<tokens %.17g> <last Unix µs>"
-- ARGV[1]      want
-- ARGV[2]      min (1 <= min <= want)
-- ARGV[1+2i]   rate of bucket i, tokens a second
-- ARGV[2+2i]   burst of bucket i
--
-- A sighting (bucket.Request.Sight) adds one key and three arguments, which the count of
-- arguments tells (3 + 2 × #KEYS with one, 2 + 2 × #KEYS without):
-- KEYS[n+1]    the identity's sightings: a sorted set of taker → last sighting (Unix ms)
-- ARGV[3+2n]   the taker; ARGV[4+2n] how long a sighting counts (ms); ARGV[5+2n] the most
--              takers kept (the oldest go first)
-- It is recorded whether or not tokens are granted, and the set expires with its last
-- sighting.
--
-- A penalty (bucket.Request.Penalty) adds one more key, last, and four more arguments,
-- last; with s = 1 for a sighting and p = 1 for a penalty, #ARGV - 2 × #KEYS - 2 = s + 2p:
-- KEYS[#KEYS]  the identity's penalty state: absent or "<count> <window start µs> <until µs>"
-- ARGV[#ARGV-3] refusals answered from memory to count (Request.Refused)
-- ARGV[#ARGV-2] the refusals that block; ARGV[#ARGV-1] the window (µs); ARGV[#ARGV] the
--              block (µs)
-- This is bucket.Penalty.Add step for step (integers, exact in doubles below 2^53): a
-- blocked identity is refused before its buckets are read; else the refusals handed over
-- are counted, then this take's own refusal, and an identity whose count reaches the
-- threshold is refused outright from then for the block. The state expires when neither
-- its window nor its block matters.
--
-- Time is the server's own (TIME, µs). A bucket's time never moves back: if the server's
-- clock is behind a bucket's (failover to a replica on another host), nothing is refilled
-- and the bucket keeps its later time. A granted take writes every bucket and sets it to
-- expire when it would be full again, so an idle identity's keys vanish; a refusal writes
-- nothing.
--
-- Reply: {granted, limiting (0-based), remaining, retry-after µs, reset µs, seen}, all
-- integers (seen: the distinct takers sighted within the time given, 0 without a sighting),
-- and with a penalty two more: {…, blocked (1: refused outright, retry-after = reset =
-- the block's end), the refusals counted in the window}:
-- Redis truncates Lua numbers in replies, and numbers passed to redis.call would be
-- formatted with 14 significant digits, so everything written is formatted here.

local eps = 1e-9
local maxwait = 1e15 -- bucket.MaxWaitMicros

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local want = tonumber(ARGV[1])
local min = tonumber(ARGV[2])
local n = #KEYS
local seen = 0
local extra = #ARGV - 2 * n - 2
local pk, pa
if extra >= 2 then
  pk, pa = KEYS[n], #ARGV - 3
  n = n - 1
end
if extra == 1 or extra == 3 then
  n = n - 1
  local sk, ttl, cap = KEYS[n + 1], tonumber(ARGV[4 + 2 * n]), tonumber(ARGV[5 + 2 * n])
  local ms = math.floor(now / 1000)
  redis.call('ZADD', sk, string.format('%.0f', ms), ARGV[3 + 2 * n])
  redis.call('ZREMRANGEBYSCORE', sk, '-inf', '(' .. string.format('%.0f', ms - ttl))
  seen = redis.call('ZCARD', sk)
  if seen > cap then
    redis.call('ZREMRANGEBYRANK', sk, 0, seen - cap - 1)
    seen = cap
  end
  redis.call('PEXPIRE', sk, string.format('%.0f', ttl + 1))
end

-- bucket.Penalty.Add and the state's write; made only for a take with a penalty, so a
-- take without one creates no closure
local pc, ps, pu, pdirty = 0, 0, 0, false
local padd, pwrite
if pk then
  padd = function(k)
    if k <= 0 or now < pu then
      return
    end
    if now - ps >= tonumber(ARGV[pa + 2]) or ps < pu then
      pc, ps, pu = 0, now, 0
    end
    pc = pc + k
    if pc >= tonumber(ARGV[pa + 1]) then
      pu = now + tonumber(ARGV[pa + 3])
    end
    pdirty = true
  end
  pwrite = function()
    if pdirty then
      local exp = ps + tonumber(ARGV[pa + 2])
      if pu > exp then
        exp = pu
      end
      redis.call('SET', pk, string.format('%.0f %.0f %.0f', pc, ps, pu), 'PX', string.format('%.0f', math.ceil((exp - now) / 1000) + 1))
    end
  end
  local v = redis.call('GET', pk)
  if v then
    local a, b, c = string.match(v, '^(%d+) (%d+) (%d+)$')
    if a then -- anything else is not ours: treat it as never refused
      pc, ps, pu = tonumber(a), tonumber(b), tonumber(c)
    end
  end
  padd(tonumber(ARGV[pa]))
  if now < pu then
    pwrite()
    return {0, 0, 0, pu - now, pu - now, seen, 1, pc}
  end
end

local vals = redis.call('MGET', unpack(KEYS, 1, n))

local rate, burst, tok, last = {}, {}, {}, {}

-- bucket.Limit.MicrosUntil
local function wait(i, have, need)
  if have + eps >= need then
    return 0
  end
  local w = math.ceil((need - have) * 1e6 / rate[i])
  if w > maxwait then
    return maxwait
  end
  return w
end

-- bucket.wholeTokens
local function whole(x)
  local w = math.floor(x + eps)
  if w < 0 then
    return 0
  end
  return w
end

-- bucket.Limit.TokensAt, and Decide's first loop
local avail = want
for i = 1, n do
  local r = tonumber(ARGV[1 + 2 * i])
  local b = tonumber(ARGV[2 + 2 * i])
  rate[i], burst[i] = r, b
  local x, l = b, now
  local v = vals[i]
  if v then
    local sp = string.find(v, ' ', 1, true)
    local st = sp and tonumber(string.sub(v, 1, sp - 1))
    local sl = sp and tonumber(string.sub(v, sp + 1))
    if st and sl then -- anything else is not ours: treat it as a full bucket
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
  tok[i], last[i] = x, l
  local a = math.floor(x + eps)
  if a < avail then
    avail = a
  end
end

if avail < min then
  local lim, ra = 1, 0
  for i = 1, n do
    local w = wait(i, tok[i], min)
    if w > ra or i == 1 then
      lim, ra = i, w
    end
  end
  if pk then
    padd(1)
    pwrite()
    if now < pu then
      return {0, 0, 0, pu - now, pu - now, seen, 1, pc}
    end
    return {0, lim - 1, whole(tok[lim]), ra, wait(lim, tok[lim], burst[lim]), seen, 0, pc}
  end
  return {0, lim - 1, whole(tok[lim]), ra, wait(lim, tok[lim], burst[lim]), seen}
end

local lim, best = 1, math.huge
for i = 1, n do
  local x = tok[i] - avail
  tok[i] = x
  if x < best then
    lim, best = i, x
  end
  local full = wait(i, x, burst[i]) -- bucket.Limit.FullAfterMicros
  if full < 1 then
    full = 1
  end
  -- Redis sets the expiry from its clock truncated to the millisecond, up to 1 ms
  -- before now: one more ms so a key never vanishes before its bucket is full.
  local ms = math.ceil((last[i] - now + full) / 1000) + 1
  redis.call('SET', KEYS[i], string.format('%.17g %.0f', x, last[i]), 'PX', string.format('%.0f', ms))
end
if pk then
  pwrite()
  return {avail, lim - 1, whole(tok[lim]), 0, wait(lim, tok[lim], burst[lim]), seen, 0, pc}
end
return {avail, lim - 1, whole(tok[lim]), 0, wait(lim, tok[lim], burst[lim]), seen}
