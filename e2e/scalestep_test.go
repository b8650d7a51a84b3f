package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/certs"
	"github.com/allot-dev/allot/pkg/testenv"
)

// One step of BenchmarkBalancerScale: a fresh balancer process, the fleet, the samples
// taken around the measured window, and the row they make.

// scaleEnv is what every step shares: etcd, the certificates, the balancer binary.
type scaleEnv struct {
	b     *testing.B
	etcd  *testenv.EtcdCluster
	files certs.Files
	tls   map[string]*tls.Config // each region's enforcer client TLS
	bin   string
	dir   string
	knobs scaleKnobs
	steps int // steps run so far: each gets its own etcd prefixes
}

// run runs one step and fills row.
func (env *scaleEnv) run(st scaleStep, row *scaleRow) {
	b, k := env.b, env.knobs
	env.steps++
	prefix := fmt.Sprintf("/allot-scale/%d-%d/", time.Now().Unix(), env.steps)
	mix := newScaleMix(st, k.rate)
	rulesFile := fmt.Sprintf("%s/rules-%d.yaml", env.dir, env.steps)
	if err := os.WriteFile(rulesFile, []byte(mix.rulesYAML()), 0o644); err != nil {
		b.Fatal(err)
	}
	row.LimitPerSec, row.HotKeys = mix.limit, len(mix.hot)
	bal := startScaleBalancer(b, env.bin, prefix, rulesFile, env.etcd.Endpoints()[0], env.files, k)
	defer bal.stop(b, k.log, fmt.Sprintf("balancer-%d-%s.log", env.steps, st))

	cli := env.etcd.Client(b)
	defer cli.Close()
	fleet, err := newScaleFleet(cli, prefix+"shares/", bal.grpc, env.tls, mix, k)
	if err != nil {
		b.Fatalf("%s: %v", st, err)
	}
	defer fleet.close()
	started := time.Now()
	if err := fleet.start(context.Background()); err != nil {
		b.Fatalf("%s: %v", st, err)
	}
	row.StartS = time.Since(started).Seconds()
	time.Sleep(time.Duration(k.warm) * k.interval) // warm-up: the first recompute and publication
	warm := fleet.sample()

	before := env.sample(bal, fleet)
	fleet.measure(true)
	fleet.moveProbe(time.Now())
	time.Sleep(time.Duration(k.measure) * k.interval)
	fleet.measure(false)
	after := env.sample(bal, fleet)
	// A probe move still under way is given until the step's end plus one interval more,
	// not measured otherwise (its figures say how long it took, whenever it ended).
	fleet.waitProbe(k.interval)
	row.fill(before, after, warm, fleet, k.interval)
}

// scaleSample is one reading of every counter a row is made of.
type scaleSample struct {
	at                   time.Time
	leaderCPU, selfCPU   time.Duration
	leaderWait, selfWait time.Duration // on a run queue (procRunWait)
	leaderRSS, leaderHW  float64       // MiB
	metrics              []byte        // the balancer's /metrics
	etcdCPU, etcdDB      float64       // process_cpu_seconds_total, etcd_mvcc_db_total_size_in_bytes
	fleet                fleetCounts
	steal, total         int64
}

func (env *scaleEnv) sample(bal *scaleBalancer, f *scaleFleet) scaleSample {
	s := scaleSample{at: time.Now(), leaderCPU: procCPU(env.b, bal.cmd.Process.Pid), selfCPU: procCPU(env.b, os.Getpid())}
	s.leaderRSS, s.leaderHW = procRSSMiB(bal.cmd.Process.Pid)
	s.leaderWait, s.selfWait = procRunWait(bal.cmd.Process.Pid), procRunWait(os.Getpid())
	s.metrics = scrape(env.b, "http://"+bal.http+"/metrics")
	em := scrape(env.b, env.etcd.Members[0].ClientURL+"/metrics")
	s.etcdCPU = metricSum(em, "process_cpu_seconds_total")
	s.etcdDB = metricSum(em, "etcd_mvcc_db_total_size_in_bytes")
	s.fleet = f.sample()
	s.steal, s.total = stealTicks()
	return s
}

// fill computes the row's figures from the samples around the measured window.
func (r *scaleRow) fill(a, z scaleSample, warm fleetCounts, f *scaleFleet, interval time.Duration) {
	wall := z.at.Sub(a.at).Seconds()
	iv := wall / interval.Seconds()
	r.MeasuredS = wall
	r.Intervals = iv
	d := z.fleet.sub(a.fleet)
	r.IdentityReports = int64(d.accepted)
	r.IdentityReportsPerInterval = d.accepted / iv
	r.DrainedPerInterval = d.identities / iv
	r.ReportsPerEnforcerInterval = d.sent / float64(r.Enforcers) / iv
	r.EarlyPerInterval = d.early / iv
	r.Failed, r.Dropped = int64(d.failures), int64(d.dropped)
	r.WarmFailed, r.WarmDropped = int64(warm.failures), int64(warm.dropped)
	cpu := (z.leaderCPU - a.leaderCPU).Seconds()
	r.LeaderCPUPerInterval = cpu / iv
	r.LeaderCores = cpu / wall
	if d.accepted > 0 {
		r.LeaderUsPerIdentityReport = cpu * 1e6 / d.accepted
	}
	r.GeneratorCores = (z.selfCPU - a.selfCPU).Seconds() / wall
	r.LeaderWaitPerInterval = (z.leaderWait - a.leaderWait).Seconds() / iv
	r.GeneratorWaitPerInterval = (z.selfWait - a.selfWait).Seconds() / iv
	r.LeaderRSSMiB, r.LeaderPeakRSSMiB = z.leaderRSS, z.leaderHW
	lat := f.latencies()
	r.Reports = len(lat)
	r.P50ms, r.P99ms, r.MaxMs = quantileMs(lat, 0.5), quantileMs(lat, 0.99), quantileMs(lat, 1)
	m := func(name string, labels ...string) float64 {
		return metricSum(z.metrics, name, labels...) - metricSum(a.metrics, name, labels...)
	}
	r.Recomputes = int(m("allot_balancer_recompute_seconds_count"))
	if r.Recomputes > 0 {
		r.RecomputeMeanMs = m("allot_balancer_recompute_seconds_sum") * 1000 / float64(r.Recomputes)
		r.RecomputeMaxMs = slowestBucket(a.metrics, z.metrics, "allot_balancer_recompute_seconds") * 1000
		if math.IsInf(r.RecomputeMaxMs, 1) {
			r.RecomputeMaxMs = -1 // over the last bucket (JSON has no infinity)
		}
	}
	r.VersionsPerInterval = m("allot_balancer_share_version") / iv
	r.EtcdKBPerInterval = m("allot_balancer_etcd_write_bytes_total") / 1024 / iv
	r.EtcdWritesPerInterval = m("allot_balancer_etcd_writes_total", `result="ok"`) / iv
	r.EtcdCPUPerInterval = (z.etcdCPU - a.etcdCPU) / iv
	r.EtcdDBMiB = z.etcdDB / (1 << 20)
	r.RefusedByLeader = int64(m("allot_balancer_reports_total") - m("allot_balancer_reports_total", `result="accepted"`))
	r.Tracked = int(metricSum(z.metrics, "allot_balancer_identities", `state="tracked"`))
	r.Listed = int(metricSum(z.metrics, "allot_balancer_identities", `state="listed"`))
	p := f.probeTimes()
	r.ProbeSettled = p.settled
	r.ProbeFirstVersionS, r.ProbeMoveS = p.firstVersion, p.moveDone
	if z.total > a.total {
		r.StealPct = 100 * float64(z.steal-a.steal) / float64(z.total-a.total)
	}
	r.LoadAvg = loadAvg()
}

// quantileMs is the q-quantile of d in ms (q = 1: the largest); 0 when empty.
func quantileMs(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := min(len(s)-1, int(math.Ceil(q*float64(len(s))))-1)
	return float64(s[max(i, 0)]) / 1e6
}

// scaleBalancer is one bin/balancer process of a step.
type scaleBalancer struct {
	cmd        *exec.Cmd
	grpc, http string
	stderr     *bytes.Buffer
	done       chan struct{}
}

// startScaleBalancer starts bin with the shipped defaults but the step's interval, etcd
// prefixes, rules and ports, over mutual TLS, and waits until it leads.
func startScaleBalancer(b *testing.B, bin, prefix, rulesFile, etcdURL string, f certs.Files, k scaleKnobs) *scaleBalancer {
	ports := freePorts(b, 2)
	p := &scaleBalancer{grpc: ports[0], http: ports[1], stderr: new(bytes.Buffer), done: make(chan struct{})}
	args := []string{
		"-regions", strings.Join(scaleRegions, ","), "-id", "scale",
		"-grpc-addr", p.grpc, "-http-addr", p.http,
		"-tls", "-tls-cert", f.Balancer(), "-tls-key", f.BalancerKey(), "-tls-client-ca", f.CA(),
		"-etcd-endpoints", etcdURL, "-election-prefix", prefix + "election", "-shares-prefix", prefix + "shares/",
		"-rules-file", rulesFile, "-interval", k.interval.String(), "-drain-timeout", "2s", "-log-level", "warn",
	}
	args = append(args, k.balancerArgs...) // later flags win
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stderr = p.stderr
	// Environment variables must not reconfigure the child behind the benchmark's back.
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "GOMAXPROCS=" + os.Getenv("GOMAXPROCS")}
	if err := p.cmd.Start(); err != nil {
		b.Fatalf("while starting %s: %v", bin, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	end := time.Now().Add(k.startTimeout)
	for {
		if resp, err := http.Get("http://" + p.http + "/readyz"); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "leader") {
				return p
			}
		}
		select {
		case <-p.done:
			b.Fatalf("balancer exited before leading; stderr:\n%s", p.stderr.String())
		default:
		}
		if time.Now().After(end) {
			p.stop(b, "1", "")
			b.Fatalf("balancer not leading after %v", k.startTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the process (SIGINT: it resigns and drains; SIGKILL after 15 s) and waits.
// log: "" keeps its stderr unless the benchmark failed, a directory gets it as file name,
// anything else prints it.
func (p *scaleBalancer) stop(b *testing.B, log, name string) {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if st, err := os.Stat(log); err == nil && st.IsDir() {
		if err := os.WriteFile(filepath.Join(log, name), p.stderr.Bytes(), 0o644); err != nil {
			b.Logf("balancer stderr: %v", err)
		}
	} else if log != "" || b.Failed() {
		b.Logf("balancer stderr:\n%s", p.stderr.String())
	}
}

// scrape GETs a Prometheus text endpoint.
func scrape(b *testing.B, url string) []byte {
	resp, err := http.Get(url)
	if err != nil {
		b.Fatalf("while scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatalf("while scraping %s: %v", url, err)
	}
	return raw
}

// metricSum sums the samples of the series named name (exactly: not name_sum for name)
// whose label sets contain every one of labels (e.g. `result="ok"`), in Prometheus text.
func metricSum(raw []byte, name string, labels ...string) float64 {
	sum := 0.0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || (rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		lbl, val := "", rest
		if rest[0] == '{' {
			end := strings.LastIndexByte(rest, '}')
			if end < 0 {
				continue
			}
			lbl, val = rest[:end+1], rest[end+1:]
		}
		match := true
		for _, l := range labels {
			match = match && strings.Contains(lbl, l)
		}
		if !match {
			continue
		}
		f := strings.Fields(val)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// slowestBucket is the upper bound (seconds) of the smallest bucket of histogram name
// that holds every observation made between the samples a and z: the slowest one took at
// most that long. +Inf when it is only in the last bucket; 0 with no observation.
func slowestBucket(a, z []byte, name string) float64 {
	total := metricSum(z, name+"_count") - metricSum(a, name+"_count")
	if total <= 0 {
		return 0
	}
	type bucket struct{ le, n float64 }
	var bs []bucket
	sc := bufio.NewScanner(bytes.NewReader(z))
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name+`_bucket{`)
		if !ok {
			continue
		}
		i := strings.Index(rest, `le="`)
		if i < 0 {
			continue
		}
		leS, _, _ := strings.Cut(rest[i+4:], `"`)
		le, err := strconv.ParseFloat(leS, 64)
		if err != nil {
			continue
		}
		lbl := `le="` + leS + `"`
		bs = append(bs, bucket{le, metricSum(z, name+"_bucket", lbl) - metricSum(a, name+"_bucket", lbl)})
	}
	slices.SortFunc(bs, func(x, y bucket) int { return cmp.Compare(x.le, y.le) })
	for _, bk := range bs {
		if bk.n >= total {
			return bk.le
		}
	}
	return math.Inf(1)
}

func (s scaleStep) String() string {
	if s.population > 0 {
		return fmt.Sprintf("%dx%d/%d", s.enforcers, s.ids, s.population)
	}
	return fmt.Sprintf("%dx%d", s.enforcers, s.ids)
}
