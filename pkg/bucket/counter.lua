-- A calendar quota's counter (pkg/quota): add a batch of counts, raise the counter to a
-- floor the caller knows it reached, set its expiry, answer the total. One call, so no
-- other enforcer's add comes between the add and the raise.
--
-- KEYS[1]  the counter: prefix{identity}#q:<quota name>:<period start, unix seconds>
-- ARGV[1]  delta: the counts to add (negative: counts given back)
-- ARGV[2]  floor: the caller's last known total + delta; a counter below it lost counts
--          (a restart without persistence, a failover's replication lag) and is raised
--          to it: the max of what Redis holds and what any enforcer knew, never the sum
-- ARGV[3]  expire at, unix milliseconds (a while after the period's end)
local v = redis.call('INCRBY', KEYS[1], ARGV[1])
local floor = tonumber(ARGV[2])
if v < floor then
  redis.call('SET', KEYS[1], floor)
  v = floor
end
redis.call('PEXPIREAT', KEYS[1], ARGV[3])
return v
