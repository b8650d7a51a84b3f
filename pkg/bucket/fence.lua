-- allot: a region's fenced enforcers (bucket.Fences), in one atomic step.
--
-- KEYS[1]   the marks: a sorted set of enforcer id → Unix ms of its last mark
-- KEYS[2]   the marks' seqs: a hash of enforcer id → the seq it marked itself with
-- KEYS[3]   the heard: a sorted set of enforcer id → Unix ms the balancer last accepted
--           a report of it, as it said
-- ARGV[1]   the calling enforcer's id ("" only reads)
-- ARGV[2]   "1": it marks itself fenced; "0": it takes its mark back (if any)
-- ARGV[3]   how long a mark counts, ms; a heard time counts twice as long (behind a report
--           aggregator the balancer confirms a report up to two intervals after it was
--           sent, so an enforcer records a heard time that old)
-- ARGV[4]   the most ids kept in each set (bucket.MaxFences)
-- ARGV[5]   now, Unix ms; 0 means the server's clock (TIME). Callers pass 0 unless a test
--           injects a clock (bucket.RedisOptions.Clock).
-- ARGV[6]   the seq kept with its mark (decimal)
-- ARGV[7]   how long ago the balancer last accepted a report of it, ms; -1: never
-- ARGV[8]   the most marks listed in the reply (bucket.MaxFenceMarks)
--
-- Forgets the marks and heard times older than their windows, adds or removes ARGV[1]'s
-- mark, records its heard time, keeps the newest ARGV[4] of each and lets the keys expire
-- a window after their newest entry. Reply: {the ids marked within the window, how long
-- ago the latest heard time of another id is (ms, -1: none in the window), then the newest
-- ARGV[8] marks as id, seq pairs}.

local marks, seqs, heard = KEYS[1], KEYS[2], KEYS[3]
local id, fenced = ARGV[1], ARGV[2]
local ttl, most, now = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local seq, heardAgo, list = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8])
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local hold = 2 * ttl
redis.call('ZREMRANGEBYSCORE', marks, '-inf', string.format('%.0f', now - ttl))
redis.call('ZREMRANGEBYSCORE', heard, '-inf', string.format('%.0f', now - hold))
if id ~= '' and fenced == '0' then
  redis.call('ZREM', marks, id)
  redis.call('HDEL', seqs, id)
elseif id ~= '' then
  redis.call('ZADD', marks, string.format('%.0f', now), id)
  redis.call('HSET', seqs, id, seq)
  redis.call('ZREMRANGEBYRANK', marks, 0, -(most + 1))
  redis.call('PEXPIRE', marks, ttl)
  redis.call('PEXPIRE', seqs, ttl)
end
if id ~= '' and heardAgo >= 0 and heardAgo < hold then
  redis.call('ZADD', heard, string.format('%.0f', now - heardAgo), id)
  redis.call('ZREMRANGEBYRANK', heard, 0, -(most + 1))
  redis.call('PEXPIRE', heard, hold)
end
-- The seqs of ids whose marks were forgotten: pruned once they are as many as the marks.
if redis.call('HLEN', seqs) > most then
  for _, f in ipairs(redis.call('HKEYS', seqs)) do
    if not redis.call('ZSCORE', marks, f) then
      redis.call('HDEL', seqs, f)
    end
  end
end
local n = redis.call('ZCARD', marks)
local mate = -1
local top = redis.call('ZREVRANGE', heard, 0, 1, 'WITHSCORES')
for i = 1, #top, 2 do
  if top[i] ~= id then
    mate = math.max(now - tonumber(top[i + 1]), 0)
    break
  end
end
local reply = {n, mate}
if list > 0 and n > 0 then
  local ids = redis.call('ZREVRANGE', marks, 0, list - 1)
  local ss = redis.call('HMGET', seqs, unpack(ids))
  for i, m in ipairs(ids) do
    reply[#reply + 1] = m
    reply[#reply + 1] = ss[i] or '0'
  end
end
return reply
