package sim

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot/pkg/sim/scenario"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// LiveOptions configure RunLive.
type LiveOptions struct {
	// Policy only labels the summary: in live mode the enforcers' own configuration (and
	// the balancer, if they follow one) decide the shares.
	Policy string
	// Targets are the gRPC addresses (allot.v1.Allot) of each region's enforcers; every
	// region of the scenario needs at least one. A request lands on a random one.
	Targets map[string][]string
	// Progress receives one line per second of the run; nil: none.
	Progress io.Writer
	// Concurrency bounds the checks in flight; 0 means 256. A request that finds all of
	// them busy for 10 ms is counted as offered and not admitted (source "other"), and the
	// progress line says how many.
	Concurrency int
	// Timeout bounds one check; 0 means 1 s. A check that fails is not admitted.
	Timeout time.Duration
	// Dial opens a connection; nil means grpc.NewClient with plaintext (loopback, tests).
	Dial func(addr string) (*grpc.ClientConn, error)
}

// ParseTargets reads "us-east=host:port,eu-west=host:port|host:port" ('|' separates
// several enforcers of one region).
func ParseTargets(s string) (map[string][]string, error) {
	out := map[string][]string{}
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		name, addrs, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" || addrs == "" {
			return nil, fmt.Errorf("sim: -targets %q: want region=host:port", part)
		}
		for _, a := range strings.Split(addrs, "|") {
			if a == "" {
				return nil, fmt.Errorf("sim: -targets %q: empty address", part)
			}
			out[name] = append(out[name], a)
		}
	}
	return out, nil
}

type liveJob struct {
	key, region, sec int
	client           allotv1.AllotClient
}

// RunLive replays sc in real time over gRPC against running enforcers: the same Poisson
// arrivals as the virtual mode (same seed, same streams), each sent as an allot.v1.Allot
// Check with api_key = plan = the key's name (the rules the enforcers run must give each
// key a rule matched by that plan; RulesYAML writes them). Faults are not injected: a
// live run's fault windows only exclude seconds from the figures, for faults the operator
// causes by hand. The share recorded per second is the regional quota the enforcers
// answered with, over the global limit; store calls are not seen (0).
func RunLive(ctx context.Context, sc *scenario.Scenario, opt LiveOptions) (*Result, error) {
	if opt.Concurrency <= 0 {
		opt.Concurrency = 256
	}
	if opt.Timeout <= 0 {
		opt.Timeout = time.Second
	}
	if opt.Policy == "" {
		opt.Policy = PolicyBalancer
	}
	dial := opt.Dial
	if dial == nil {
		dial = func(addr string) (*grpc.ClientConn, error) {
			return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		}
	}
	for name := range opt.Targets {
		if sc.RegionIndex(name) < 0 {
			return nil, fmt.Errorf("sim: -targets names region %q, which the scenario does not have", name)
		}
	}
	clients := make([][]allotv1.AllotClient, len(sc.Regions))
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for r, reg := range sc.Regions {
		addrs := opt.Targets[reg.Name]
		if len(addrs) == 0 {
			return nil, fmt.Errorf("sim: no -targets for region %s", reg.Name)
		}
		for _, a := range addrs {
			c, err := dial(a)
			if err != nil {
				return nil, fmt.Errorf("sim: while dialling %s (%s): %w", a, reg.Name, err)
			}
			conns = append(conns, c)
			clients[r] = append(clients[r], allotv1.NewAllotClient(c))
		}
	}

	secs := int(sc.Duration / time.Second)
	R := len(sc.Regions)
	// Live mode counts in the cells (no tally).
	keys := newKeyStates(sc, secs, true)
	var mu sync.Mutex              // mu guards keys' cells and counters, written by the workers
	dropped := make([]int, secs+1) // per second: due while every check was in flight

	jobs := make(chan liveJob, opt.Concurrency)
	var wg sync.WaitGroup
	for range opt.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				key := &sc.Keys[j.key]
				cctx, cancel := context.WithTimeout(ctx, opt.Timeout)
				resp, err := j.client.Check(cctx, &allotv1.CheckRequest{ApiKey: key.Name, Plan: key.Name})
				cancel()
				mu.Lock()
				c := &keys[j.key].cells[j.sec*R+j.region]
				switch {
				case err != nil:
					c.Sources[numSourceCols-1]++
				default:
					if resp.GetAllowed() {
						c.Admitted++
					}
					c.Sources[liveSourceCol(resp.GetSource())]++
					if ws := resp.GetWindowSeconds(); ws > 0 && keys[j.key].rate > 0 {
						c.RegionalRate = float64(resp.GetQuota()) / float64(ws)
						c.Share = c.RegionalRate / keys[j.key].rate
					}
				}
				mu.Unlock()
			}
		}()
	}

	var streams streamHeap
	for r := range sc.Regions {
		streams.push(newStreams(sc, r), r)
	}
	streams.init()
	pick := rand.New(rand.NewPCG(uint64(sc.Seed), 0x11fe))
	end := int64(sc.Duration)
	start := time.Now()
	printed := 0
	progress := func(upTo int) {
		for ; printed < upTo && printed < secs; printed++ {
			if opt.Progress == nil {
				continue
			}
			mu.Lock()
			line := fmt.Sprintf("t=%3ds", printed)
			var off, adm int64
			for k := range keys {
				for r := 0; r < R; r++ {
					c := &keys[k].cells[printed*R+r]
					off += c.Offered
					adm += c.Admitted
				}
			}
			line += fmt.Sprintf("  offered %6d/s  admitted %6d/s", off, adm)
			if d := dropped[printed]; d > 0 {
				line += fmt.Sprintf("  (%d not sent in time: all %d checks in flight)", d, opt.Concurrency)
			}
			mu.Unlock()
			fmt.Fprintln(opt.Progress, line)
		}
	}
	var runErr error
	timer := time.NewTimer(0)
	<-timer.C
loop:
	for {
		top := streams.top()
		st, key, region := top.s, int(top.key), int(top.region)
		if st.next >= end {
			break
		}
		due := start.Add(time.Duration(st.next))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				runErr = ctx.Err()
				break loop
			case <-timer.C:
			}
		}
		sec := int(st.next / int64(time.Second))
		progress(sec - 1) // seconds before the last are complete (up to in-flight checks)
		cl := clients[region]
		j := liveJob{key: key, region: region, sec: sec, client: cl[pick.IntN(len(cl))]}
		mu.Lock()
		keys[key].cells[sec*R+region].Offered++
		mu.Unlock()
		// Wait a little for a free worker (the schedule slips by as much), then give up on
		// the request: it stays offered and not admitted.
		select {
		case jobs <- j:
		default:
			timer.Reset(10 * time.Millisecond)
			select {
			case jobs <- j:
				timer.Stop()
			case <-timer.C:
				mu.Lock()
				dropped[sec]++
				keys[key].cells[sec*R+region].Sources[numSourceCols-1]++
				mu.Unlock()
			}
		}
		st.advance()
		streams.advanced()
	}
	close(jobs)
	wg.Wait()
	progress(secs)
	if runErr != nil {
		return nil, fmt.Errorf("sim: live run stopped: %w", runErr)
	}
	return judgeRun(sc, opt.Policy, secs, keys, nil, nil, faultSpans(sc)), nil
}

func liveSourceCol(s allotv1.Source) int {
	switch s {
	case allotv1.Source_SOURCE_REDIS, allotv1.Source_SOURCE_MEMORY:
		return 0
	case allotv1.Source_SOURCE_LEASE:
		return 1
	case allotv1.Source_SOURCE_REFUSAL_CACHE:
		return 2
	case allotv1.Source_SOURCE_FALLBACK:
		return 3
	case allotv1.Source_SOURCE_FAIL_OPEN:
		return 4
	}
	return numSourceCols - 1
}

// RulesYAML writes the rule set a live run's enforcers need: one rule per key, matched by
// plan = the key's name, counted per API key, with the key's global limit. Each region's
// enforcers enforce their share of it (their rules' shares, or the balancer's).
func RulesYAML(w io.Writer, sc *scenario.Scenario) error {
	if _, err := fmt.Fprintf(w, "# Rules for regionsim scenario %s: one rule per key, matched by plan.\nversion: \"regionsim-%s\"\nrules:\n", sc.Name, sc.Name); err != nil {
		return err
	}
	for _, k := range sc.Keys {
		if _, err := fmt.Fprintf(w, "  - id: %s\n    match: {plan: %s}\n    by: api_key\n    limits:\n      - {name: limit, rate: %g, per: %s, burst: %g}\n",
			k.Name, k.Name, k.Limit.Rate, k.Limit.Per, k.Limit.Burst); err != nil {
			return err
		}
	}
	return nil
}
