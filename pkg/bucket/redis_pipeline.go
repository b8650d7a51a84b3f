package bucket

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Auto-pipelining (RedisOptions.Pipeline). Concurrent Takes on one shard are coalesced:
// a caller builds its EVALSHA, enqueues it on its shard's batcher and waits; the batcher
// takes whatever is queued (no added wait; up to MaxBatch), sends it as one pipeline — one write and one read on one connection — and
// wakes each caller, who reads its own reply. A take that finds nothing of its shard on
// the wire (low load) is sent alone by its caller, without the hop to the batcher; one
// that finds a take or a batch in flight is queued. Guarantees are those of an unpipelined
// Take:
//
//   - Each command is its caller's alone: its reply or its error (WRONGTYPE, NOSCRIPT, a
//     dropped connection) goes to that caller only; a NOSCRIPT reply is followed by the
//     caller's own EVAL, as in Take.
//   - A caller whose ctx ends stops waiting and gets ctx.Err(). Its command may already be
//     on the wire and run: it errs under, as any call whose reply is lost does. A command
//     whose caller has left before it is sent is not sent.
//   - Commands are never retried on a network error (go-redis would retry a cluster
//     pipeline MaxRedirects times whatever MaxRetries says); MOVED and ASK replies are
//     still followed, as the command did not run.
//   - One batcher (goroutine) per shard, so a stalled shard delays only its own takes.
//     A batch is sent with the latest deadline of its callers (none if one has none).
//   - The queue is bounded (4 × MaxBatch): when it is full, a caller sends alone.
//   - Close stops the batchers after they have sent what was queued, and waits for them;
//     a Take that finds its batcher stopped sends alone.

// defaultMaxBatch is RedisOptions.MaxBatch when zero.
const defaultMaxBatch = 128

// pipeliner is what a go-redis client offers to send a pipeline.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// takeCmd is a script call that go-redis never retries on a network error (the script may
// have run). MOVED and ASK are still followed.
type takeCmd struct{ *redis.IntSliceCmd }

// NoRetry implements redis.Cmder.
func (takeCmd) NoRetry() bool { return true }

const (
	waiting int32 = iota
	served
	abandoned
)

// waiter is one pipelined take, pooled. The caller owns it until it is enqueued; then the
// batcher until it is served. A caller that leaves (ctx ended) marks it abandoned and
// forgets it; the batcher then returns it to the pool.
type waiter struct {
	call  redisCall
	cmd   takeCmd
	ctx   context.Context
	state atomic.Int32
	done  chan struct{} // cap 1: one send per serve
}

// batcher coalesces the takes of one shard.
type batcher struct {
	r       *Redis
	q       chan *waiter
	stop    chan struct{} // closed by Close
	stopped chan struct{} // closed by run as it returns
	busy    atomic.Bool   // a take or a batch of this shard is on the wire
	pipe    redis.Pipeliner
	batch   []*waiter
	cmds    []redis.Cmder
	dl      deadlineCtx
}

// batcherFor returns identity's shard's batcher, starting it on first use; nil after
// Close.
func (r *Redis) batcherFor(identity string) *batcher {
	shard := r.ShardOf(identity) // "" on a single node, or before the slot table is known
	if b, ok := (*r.batchers.Load())[shard]; ok {
		return b
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.batchers.Load()
	if b, ok := old[shard]; ok || r.closed {
		return b
	}
	b := &batcher{
		r:       r,
		q:       make(chan *waiter, 4*r.maxBatch),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
		pipe:    r.client.(pipeliner).Pipeline(),
		batch:   make([]*waiter, 0, r.maxBatch),
		cmds:    make([]redis.Cmder, 0, r.maxBatch),
	}
	m := make(map[string]*batcher, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[shard] = b
	r.batchers.Store(&m)
	r.wg.Add(1)
	go b.run()
	return b
}

// Close stops the pipelining goroutines (after they have sent what was queued) and waits
// for them. Idempotent; Takes after Close send alone. It does not close the client.
func (r *Redis) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		r.wg.Wait()
		return nil
	}
	r.closed = true
	bs := *r.batchers.Load()
	r.mu.Unlock()
	for _, b := range bs {
		close(b.stop)
	}
	r.wg.Wait()
	return nil
}

// takePipelined is Take through b: alone, without a hop to the batcher, when nothing of
// the shard is on the wire (low load); else queued for the next batch.
func (r *Redis) takePipelined(ctx context.Context, b *batcher, req *Request) (Result, error) {
	if !b.busy.Load() && b.busy.CompareAndSwap(false, true) {
		res, err := r.takeAlone(ctx, req)
		b.busy.Store(false)
		return res, err
	}
	w := r.waiters.Get().(*waiter)
	args := w.call.build(r.prefix, req)
	w.cmd.IntSliceCmd = redis.NewIntSliceCmd(ctx, args...)
	w.ctx = ctx
	w.state.Store(waiting)
	select {
	case b.q <- w:
	default: // queue full: send alone
		r.putWaiter(w)
		return r.takeAlone(ctx, req)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiting, abandoned) {
			return Result{}, ctx.Err() // the batcher returns w to the pool
		}
		<-w.done // served meanwhile: use the answer
	case <-b.stopped:
		if w.state.CompareAndSwap(waiting, abandoned) {
			// Never sent: the batcher served all it took before stopping. w stays in the
			// dead queue.
			return r.takeAlone(ctx, req)
		}
		<-w.done
	}
	err := w.cmd.Err()
	if err != nil {
		if cerr := ctxEnded(ctx); cerr != nil {
			// The batch failed as the caller's time ran out (its deadline bounded the
			// batch): report that as ctx.Err(), as a caller that stopped waiting gets it.
			r.putWaiter(w)
			return Result{}, cerr
		}
	}
	res, err := r.reply(ctx, &w.call, args, req, w.cmd.IntSliceCmd, err)
	r.putWaiter(w)
	return res, err
}

func (r *Redis) putWaiter(w *waiter) {
	w.cmd.IntSliceCmd, w.ctx = nil, nil
	r.waiters.Put(w)
}

func newWaiter() any {
	w := &waiter{done: make(chan struct{}, 1)}
	w.call.init()
	return w
}

// run sends batches until Close, then sends what is queued and returns.
func (b *batcher) run() {
	defer b.r.wg.Done()
	defer close(b.stopped)
	for {
		select {
		case w := <-b.q:
			b.batch = append(b.batch, w)
		case <-b.stop:
			for {
				b.fill()
				if len(b.batch) == 0 {
					return
				}
				b.send()
			}
		}
		b.fill()
		b.send()
	}
}

// fill adds what is queued, up to MaxBatch, without waiting.
func (b *batcher) fill() {
	for len(b.batch) < b.r.maxBatch {
		select {
		case w := <-b.q:
			b.batch = append(b.batch, w)
		default:
			return
		}
	}
}

// send sends the batch's live commands as one pipeline and serves every waiter.
func (b *batcher) send() {
	var latest time.Time
	bounded := true
	live := b.batch[:0]
	for _, w := range b.batch {
		if w.state.Load() == abandoned {
			b.r.putWaiter(w)
			continue
		}
		if err := w.ctx.Err(); err != nil {
			w.cmd.SetErr(err) // its caller is leaving: not sent
			b.serve(w)
			continue
		}
		if d, ok := w.ctx.Deadline(); !ok {
			bounded = false
		} else if d.After(latest) {
			latest = d
		}
		live = append(live, w)
		b.cmds = append(b.cmds, &w.cmd)
	}
	if len(b.cmds) > 0 {
		var ctx context.Context = context.Background()
		if bounded {
			b.dl.d = latest
			ctx = &b.dl
		}
		b.r.calls.Add(uint64(len(b.cmds)))
		b.busy.Store(true)
		_ = b.pipe.BatchProcess(ctx, b.cmds...)
		_, err := b.pipe.Exec(ctx)
		b.busy.Store(false)
		if err != nil {
			for _, w := range live {
				if w.cmd.Err() == nil && len(w.cmd.Val()) == 0 {
					w.cmd.SetErr(err) // not answered (a hook stopped the pipeline)
				}
			}
		}
	}
	for _, w := range live {
		b.serve(w)
	}
	clear(b.cmds)
	clear(b.batch)
	b.cmds, b.batch = b.cmds[:0], b.batch[:0]
}

// serve hands w back to its caller, or to the pool if the caller has left.
func (b *batcher) serve(w *waiter) {
	if w.state.CompareAndSwap(waiting, served) {
		w.done <- struct{}{}
		return
	}
	b.r.putWaiter(w)
}

// deadlineCtx is a context that carries only a deadline (it is never cancelled): it
// bounds a batch's socket reads and writes without a timer per batch.
type deadlineCtx struct{ d time.Time }

func (c *deadlineCtx) Deadline() (time.Time, bool) { return c.d, true }
func (*deadlineCtx) Done() <-chan struct{}         { return nil }
func (*deadlineCtx) Err() error                    { return nil }
func (*deadlineCtx) Value(any) any                 { return nil }

var errNoPipeline = errors.New("bucket: RedisOptions.Pipeline: the client cannot pipeline (no Pipeline method)")
