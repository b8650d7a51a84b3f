package bucket

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/pkg/clock"
	"github.com/redis/go-redis/v9"
)

//go:embed redis.lua
var takeScript string

// takeSHA is the script's SHA1, the name EVALSHA calls it by.
var takeSHA = func() string {
	h := sha1.Sum([]byte(takeScript))
	return hex.EncodeToString(h[:])
}()

// DefaultKeyPrefix starts every key the Redis store writes.
const DefaultKeyPrefix = "allot:"

// RedisClient is the part of a go-redis client the Redis store uses. *redis.Client,
// *redis.ClusterClient and redis.UniversalClient satisfy it.
type RedisClient interface {
	Process(ctx context.Context, cmd redis.Cmder) error
	ScriptLoad(ctx context.Context, script string) *redis.StringCmd
}

// masterForKey is what *redis.ClusterClient offers to map a key to its slot's master from
// the client's cached slot table.
type masterForKey interface {
	MasterForKey(ctx context.Context, key string) (*redis.Client, error)
}

// RedisOptions configures a Redis store. The zero value is valid.
type RedisOptions struct {
	// KeyPrefix starts every key (DefaultKeyPrefix if empty). It must not contain '{' or
	// '}', which would move the cluster hash tag, and is at most 64 bytes. Tests and
	// deployments sharing one Redis use it to keep apart.
	KeyPrefix string
	// Pipeline coalesces concurrent Takes on one shard into one pipeline (one write and
	// one read for many takes; redis_pipeline.go says what is kept). Off by default:
	// every Take is then its own round trip. The client must have a Pipeline method
	// (*redis.Client and *redis.ClusterClient do); the store then needs Close.
	Pipeline bool
	// MaxBatch bounds the takes in one pipeline (default 128); each shard queues at most
	// 4 × MaxBatch, past which a Take sends alone. Used only with Pipeline.
	MaxBatch int
	// Clock, when set, gives the in-flight script its time (Acquire, Release) instead of
	// the server's own (TIME): for tests that advance a fake clock past a hold's timeout.
	// Leave it nil in production, where the server's clock is the one all enforcers share.
	// Buckets always use the server's clock.
	Clock clock.Clock
}

// Validate names the field at fault.
func (o RedisOptions) Validate() error {
	if strings.ContainsAny(o.KeyPrefix, "{}") {
		return fmt.Errorf("bucket: RedisOptions.KeyPrefix %q contains '{' or '}'", o.KeyPrefix)
	}
	if len(o.KeyPrefix) > 64 {
		return fmt.Errorf("bucket: RedisOptions.KeyPrefix is %d bytes, more than 64", len(o.KeyPrefix))
	}
	if o.MaxBatch < 0 || o.MaxBatch > 1<<16 {
		return fmt.Errorf("bucket: RedisOptions.MaxBatch %d is not in [0, 65536]", o.MaxBatch)
	}
	return nil
}

// Redis is a Store whose buckets live in Redis (one node or a Redis Cluster), shared by
// every process that uses the same Redis. Safe for concurrent use; the zero value is not
// usable: call NewRedis.
//
// Each Take is exactly one script call on the identity's shard (two after the script
// cache was lost, see below). The script reads every bucket of the request, refills them
// with the server's own clock (TIME), decides exactly as Decide does, and writes them back
// in one atomic step, so concurrent takers on any number of processes never admit more
// than burst + rate × elapsed per bucket. It errs under, never over, in two rare cases: a
// call whose reply is lost (timeout) may have taken tokens that were never reported as
// granted, and go-redis, which by default retries a command after a read timeout or a
// dropped connection (MaxRetries 3), may run the script twice. It errs over in one: Redis
// replicates asynchronously, so a failover to a replica that had not received the latest
// writes forgets those takes — a few extra grants, once.
//
// Configure the client for a limiter: ContextTimeoutEnabled: true, or go-redis ignores
// the ctx deadline on the socket and a call waits out ReadTimeout (5 s by default) however
// short the caller's deadline; and MaxRetries: -1 if a take must never run twice.
//
// Keys are KeyPrefix + "{" + identity + "}:" + limit name, with '%', '{' and '}' in the
// identity percent-escaped, so all buckets of one identity share one cluster slot (the
// hash tag is exactly the escaped identity) and distinct (identity, name) pairs never
// share a key. A bucket's key expires when the bucket would be full again. An identity's
// sightings (Request.Sight) are a sorted set at KeyPrefix + "{" + identity + "}#seen",
// in the same slot, expiring with its last sighting.
//
// The script is called by SHA (EVALSHA). When a node answers NOSCRIPT (restart, failover,
// SCRIPT FLUSH), Take sends the script itself once (EVAL), which runs it and caches it on
// that node again; later calls go back to EVALSHA. Preload loads it on every node ahead.
//
// It is a Settler too (redis_settle.go): a marker is one SET NX PX beside the identity's
// buckets, a settlement one script (settle.lua) that deletes it and adjusts the buckets.
//
// With RedisOptions.Pipeline, concurrent Takes on one shard share a pipeline, sent by one
// goroutine per shard that Close stops; every guarantee above holds per take.
type Redis struct {
	// mu guards closed and replacing batchers (Takes read batchers without it).
	mu       sync.Mutex
	client   RedisClient
	cluster  masterForKey // nil on a single node
	prefix   string
	calls    atomic.Uint64
	known    atomic.Bool // the cluster client has a slot table (ShardOf needs no round trip)
	pool     sync.Pool   // *redisCall
	pipeline bool
	maxBatch int
	waiters  sync.Pool                           // *waiter
	batchers atomic.Pointer[map[string]*batcher] // by shard address; copied on write
	closed   bool
	wg       sync.WaitGroup // batchers
	clock    clock.Clock    // RedisOptions.Clock: nil, the server's
}

// NewRedis returns a Redis store over client (a *redis.Client, *redis.ClusterClient or
// any redis.UniversalClient). It does not touch the network; see Preload.
func NewRedis(client RedisClient, opts RedisOptions) (*Redis, error) {
	if client == nil {
		return nil, errors.New("bucket: NewRedis: nil client")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.KeyPrefix == "" {
		opts.KeyPrefix = DefaultKeyPrefix
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	if _, ok := client.(pipeliner); opts.Pipeline && !ok {
		return nil, errNoPipeline
	}
	r := &Redis{client: client, prefix: opts.KeyPrefix, pipeline: opts.Pipeline, maxBatch: opts.MaxBatch, clock: opts.Clock}
	if c, ok := client.(masterForKey); ok {
		r.cluster = c
	}
	r.pool.New = func() any { return newRedisCall() }
	r.waiters.New = newWaiter
	r.batchers.Store(&map[string]*batcher{})
	return r, nil
}

// ScriptSHA is the SHA1 of the take script, as SCRIPT EXISTS knows it.
func ScriptSHA() string { return takeSHA }

// Preload loads the script on every node (on a cluster, every master and replica) and,
// on a cluster, the client's slot table. Optional: Take loads what it needs on first use.
func (r *Redis) Preload(ctx context.Context) error {
	if err := r.client.ScriptLoad(ctx, takeScript).Err(); err != nil {
		return fmt.Errorf("bucket: while loading the take script: %w", err)
	}
	if err := r.client.ScriptLoad(ctx, inflightScript).Err(); err != nil {
		return fmt.Errorf("bucket: while loading the in-flight script: %w", err)
	}
	if err := r.client.ScriptLoad(ctx, settleScript).Err(); err != nil {
		return fmt.Errorf("bucket: while loading the settle script: %w", err)
	}
	if err := r.client.ScriptLoad(ctx, counterScript).Err(); err != nil {
		return fmt.Errorf("bucket: while loading the quota counter script: %w", err)
	}
	if err := r.client.ScriptLoad(ctx, fenceScript).Err(); err != nil {
		return fmt.Errorf("bucket: while loading the fence script: %w", err)
	}
	r.known.Store(true)
	return nil
}

// Calls returns how many script calls (EVALSHA and EVAL) the store has sent. Requests
// refused by validation send none.
func (r *Redis) Calls() uint64 { return r.calls.Load() }

// ShardOf returns the address of the master owning identity's slot, from the cluster
// client's cached slot table (go-redis refreshes it on MOVED and periodically); "" on a
// single node, and "" on a cluster until the store has completed a call or Preload, so
// ShardOf never waits on the network. It does not allocate.
func (r *Redis) ShardOf(identity string) string {
	if r.cluster == nil || !r.known.Load() {
		return ""
	}
	// Any key without braces whose CRC16 falls in the slot maps to the slot's master;
	// MasterForKey reads the loaded table without a round trip.
	c, err := r.cluster.MasterForKey(context.Background(), slotKey(Slot(identity)))
	if err != nil {
		return ""
	}
	return c.Options().Addr
}

// Key returns the Redis key of identity's bucket name (for tests and operators).
func (r *Redis) Key(identity, name string) string {
	return string(appendKey(nil, r.prefix, identity, name))
}

// Take implements Store.
func (r *Redis) Take(ctx context.Context, req *Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	return r.TakeValid(ctx, req)
}

// TakeValid is Take of a request the caller has validated (ValidTaker).
func (r *Redis) TakeValid(ctx context.Context, req *Request) (Result, error) {
	if r.pipeline {
		if b := r.batcherFor(req.Identity); b != nil {
			return r.takePipelined(ctx, b, req)
		}
	}
	return r.takeAlone(ctx, req)
}

// takeAlone sends req's script call on its own.
func (r *Redis) takeAlone(ctx context.Context, req *Request) (Result, error) {
	c := r.pool.Get().(*redisCall)
	args := c.build(r.prefix, req)
	r.calls.Add(1)
	cmd := redis.NewIntSliceCmd(ctx, args...)
	res, err := r.reply(ctx, c, args, req, cmd, r.client.Process(ctx, cmd))
	r.pool.Put(c)
	return res, err
}

// reply turns the script call's outcome into a Result, after sending the script itself
// (EVAL) if the node had lost it. c holds args.
func (r *Redis) reply(ctx context.Context, c *redisCall, args []any, req *Request, cmd *redis.IntSliceCmd, err error) (Result, error) {
	if isNoScript(err) {
		// The node lost its script cache. EVAL runs the script and caches it again; the
		// EVALSHA did not run, so nothing was taken twice.
		args[0], c.strs[1] = "eval", takeScript
		r.calls.Add(1)
		cmd = redis.NewIntSliceCmd(ctx, args...)
		err = r.client.Process(ctx, cmd)
		args[0], c.strs[1] = "evalsha", takeSHA
	}
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil && !errors.Is(err, cerr) {
			// The caller's deadline passed while the socket's own timeout fired first: say
			// both, so errors.Is(err, context.DeadlineExceeded) holds whichever won.
			return Result{}, fmt.Errorf("bucket: redis: while taking for identity %.64q: %w (%w)", req.Identity, cerr, err)
		}
		return Result{}, fmt.Errorf("bucket: redis: while taking for identity %.64q: %w", req.Identity, err)
	}
	if r.cluster != nil && !r.known.Load() {
		r.known.Store(true)
	}
	v := cmd.Val()
	if req.Penalty != nil {
		if len(v) != 8 || v[6] < 0 || v[6] > 1 || v[7] < 0 {
			return Result{}, fmt.Errorf("bucket: redis: unexpected script reply %v for identity %.64q (with a penalty)", v, req.Identity)
		}
		v = v[:6]
	}
	if len(v) != 6 || v[0] < 0 || v[0] > req.Want || v[1] < 0 || v[1] >= int64(len(req.Limits)) || v[5] < 0 || v[5] > MaxSightings {
		return Result{}, fmt.Errorf("bucket: redis: unexpected script reply %v for identity %.64q", v, req.Identity)
	}
	res := ResultOf(Decision{
		Granted:          v[0],
		Limiting:         int(v[1]),
		Remaining:        v[2],
		RetryAfterMicros: v[3],
		ResetMicros:      v[4],
	}, SourceRedis)
	res.Seen = int(v[5])
	if req.Penalty != nil {
		v = cmd.Val()
		res.Penalized, res.PenaltyCount = v[6] == 1, v[7]
	}
	return res, nil
}

// evalSHA sends args ("evalsha", the script's SHA, then its keys and arguments) as a
// command newCmd builds, and once more as EVAL of script when the node answers NOSCRIPT
// (restart, failover, SCRIPT FLUSH): the EVALSHA did not run, so nothing runs twice.
// Each send counts in Calls.
func evalSHA[C redis.Cmder](ctx context.Context, r *Redis, script string, newCmd func(context.Context, ...any) C, args []any) (C, error) {
	r.calls.Add(1)
	cmd := newCmd(ctx, args...)
	err := r.client.Process(ctx, cmd)
	if isNoScript(err) {
		args[0], args[1] = "eval", script
		r.calls.Add(1)
		cmd = newCmd(ctx, args...)
		err = r.client.Process(ctx, cmd)
	}
	return cmd, err
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// maxArgs is the longest command: evalsha sha numkeys, the keys, the sightings key and
// the penalty key, want min, rate and burst for each key, the sighting's three and the
// penalty's four.
const maxArgs = 3 + MaxLimits + 2 + 2 + 2*MaxLimits + 3 + 4

// redisCall holds one command's arguments, reused through a sync.Pool so a Take builds
// them without allocating: args[i] points at strs[i] (a *string goes into an interface
// without an allocation, and go-redis writes and routes by it), and the strings are cut
// from one string made from buf. go-redis does not keep a command's arguments after
// Process returns; a Hook that does must copy them.
type redisCall struct {
	buf  []byte
	ends [maxArgs]int
	strs [maxArgs]string
	args [maxArgs]any
}

func newRedisCall() *redisCall {
	c := &redisCall{}
	c.init()
	return c
}

// init prepares c for build; c must not be copied after.
func (c *redisCall) init() {
	c.buf = make([]byte, 0, 256)
	c.args[0] = "evalsha"
	c.strs[1] = takeSHA
	for i := 1; i < maxArgs; i++ {
		c.args[i] = &c.strs[i]
	}
}

// build fills the call for req and returns its arguments.
func (c *redisCall) build(prefix string, req *Request) []any {
	n := len(req.Limits)
	sight := req.Sight != ""
	pen := req.Penalty
	b := c.buf[:0]
	k := 2
	keys := n
	if sight {
		keys++
	}
	if pen != nil {
		keys++
	}
	b = strconv.AppendInt(b, int64(keys), 10)
	c.ends[k] = len(b)
	k++
	for _, l := range req.Limits {
		b = appendKey(b, prefix, req.Identity, l.Name)
		c.ends[k] = len(b)
		k++
	}
	if sight {
		b = appendSightKey(b, prefix, req.Identity)
		c.ends[k] = len(b)
		k++
	}
	if pen != nil {
		b = appendPenaltyKey(b, prefix, req.Identity, pen.Name)
		c.ends[k] = len(b)
		k++
	}
	b = strconv.AppendInt(b, req.Want, 10)
	c.ends[k] = len(b)
	k++
	b = strconv.AppendInt(b, req.MinGrant(), 10)
	c.ends[k] = len(b)
	k++
	for _, l := range req.Limits {
		// Shortest form that parses back to the same float64 (Lua's tonumber is strtod).
		b = strconv.AppendFloat(b, l.Rate, 'g', -1, 64)
		c.ends[k] = len(b)
		k++
		b = strconv.AppendFloat(b, l.Burst, 'g', -1, 64)
		c.ends[k] = len(b)
		k++
	}
	if sight {
		b = append(b, req.Sight...)
		c.ends[k] = len(b)
		k++
		b = strconv.AppendInt(b, max(req.SightTTL.Milliseconds(), 1), 10)
		c.ends[k] = len(b)
		k++
		b = strconv.AppendInt(b, MaxSightings, 10)
		c.ends[k] = len(b)
		k++
	}
	if pen != nil {
		for _, x := range [...]int64{req.Refused, pen.Refusals, pen.Within.Microseconds(), pen.Block.Microseconds()} {
			b = strconv.AppendInt(b, x, 10)
			c.ends[k] = len(b)
			k++
		}
	}
	c.buf = b
	s := string(b) // the one allocation: go-redis takes strings
	start := 0
	for i := 2; i < k; i++ {
		c.strs[i] = s[start:c.ends[i]]
		start = c.ends[i]
	}
	return c.args[:k]
}

// appendKey appends identity's key for bucket name: prefix{escaped identity}:name. The
// tag holds no '{' or '}' and ends at the first '}', so the name needs no escaping for
// keys to stay distinct.
func appendKey(b []byte, prefix, identity, name string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	b = appendEscaped(b, identity)
	b = append(b, '}', ':')
	return append(b, name...)
}

// appendSightKey appends identity's sightings key: prefix{escaped identity}#seen, in the
// identity's slot and apart from its buckets (whose keys go on with ':').
func appendSightKey(b []byte, prefix, identity string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	b = appendEscaped(b, identity)
	return append(b, "}#seen"...)
}

// appendPenaltyKey appends identity's state of the penalty name:
// prefix{escaped identity}#penalty:name, in the identity's slot and apart from its buckets
// and sightings.
func appendPenaltyKey(b []byte, prefix, identity, name string) []byte {
	b = append(b, prefix...)
	b = append(b, '{')
	b = appendEscaped(b, identity)
	b = append(b, "}#penalty:"...)
	return append(b, name...)
}

// PenaltyKey returns the Redis key of identity's state of the penalty name (for tests
// and operators).
func (r *Redis) PenaltyKey(identity, name string) string {
	return string(appendPenaltyKey(nil, r.prefix, identity, name))
}

// Slot returns the Redis Cluster hash slot of every bucket of identity: CRC16 (XMODEM) of
// the escaped identity, mod 16384. It does not allocate.
func Slot(identity string) int {
	var crc uint16
	for i := 0; i < len(identity); i++ {
		switch ch := identity[i]; ch {
		case '%':
			crc = crc16(crc16(crc16(crc, '%'), '2'), '5')
		case '{':
			crc = crc16(crc16(crc16(crc, '%'), '7'), 'B')
		case '}':
			crc = crc16(crc16(crc16(crc, '%'), '7'), 'D')
		default:
			crc = crc16(crc, ch)
		}
	}
	return int(crc & (numSlots - 1))
}

const numSlots = 16384

func crc16(crc uint16, b byte) uint16 {
	crc ^= uint16(b) << 8
	for range 8 {
		if crc&0x8000 != 0 {
			crc = crc<<1 ^ 0x1021
		} else {
			crc <<= 1
		}
	}
	return crc
}

// slotKeys holds, for every slot, a two-byte key (no braces counted: a two-byte key has no
// non-empty tag) whose CRC16 falls in it: slot s's key is slotKeys[2s:2s+2]. CRC16 of a
// two-byte message is a bijection on 16 bits, so every slot has four such keys.
var slotKeys = sync.OnceValue(func() string {
	b := make([]byte, 2*numSlots)
	for m := 0; m < 1<<16; m++ {
		s := int(crc16(crc16(0, byte(m>>8)), byte(m)) & (numSlots - 1))
		b[2*s], b[2*s+1] = byte(m>>8), byte(m)
	}
	return string(b)
})

func slotKey(slot int) string { return slotKeys()[2*slot : 2*slot+2] }

func needsEscape(s string) bool { return strings.ContainsAny(s, "%{}") }

// appendEscaped appends s with '%', '{' and '}' percent-escaped.
func appendEscaped(b []byte, s string) []byte {
	if !needsEscape(s) {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; ch {
		case '%':
			b = append(b, "%25"...)
		case '{':
			b = append(b, "%7B"...)
		case '}':
			b = append(b, "%7D"...)
		default:
			b = append(b, ch)
		}
	}
	return b
}

// ctxEnded is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has passed even if
// its timer has not fired yet: go-redis sets the socket's read deadline from ctx, and the
// socket can time out a moment before the context's own timer runs. Called on error paths
// only (it may read the clock).
func ctxEnded(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}
