package rules

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func put(t *testing.T, cli *clientv3.Client, key, val string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Put(ctx, key, val)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return resp.Header.Revision
}

func limitOf(h *Holder, id string) float64 {
	c := h.Current().Rule(id)
	if c == nil {
		return -1
	}
	return c.Limits[0].Rate
}

func startSource(t *testing.T, cli *clientv3.Client, prefix string, h *Holder, opts ...Option) (*EtcdSource, *errRecorder) {
	t.Helper()
	rec := &errRecorder{}
	opts = append([]Option{WithOnError(rec.hook), WithLogger(testLogger(t)), WithInterval(200 * time.Millisecond),
		WithBackoff(50*time.Millisecond, 500*time.Millisecond), WithTimeout(time.Second)}, opts...)
	src, err := NewEtcdSource(cli, prefix, h, CompileOptions{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- src.Run(context.Background()) }()
	t.Cleanup(func() {
		src.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Errorf("Run returned %v", err)
		}
	})
	return src, rec
}

func TestEtcdSource(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)

	t.Run("put, bad rule, delete, base", func(t *testing.T) {
		const p = "/allot/rules/a/"
		put(t, cli, p+"default", `{"limits":[{"name":"s","rate":10,"per":"1s"}]}`)
		base := mustParse(t, "rules:\n  - id: from-file\n    limits: [{name: s, rate: 1, per: 1s}]\n  - id: default\n    limits: [{name: s, rate: 2, per: 1s}]\n")
		h := NewHolder(nil)
		src, rec := startSource(t, cli, p, h, WithBase(base))
		poll.True(t, 5*time.Second, "initial list", func() bool { return limitOf(h, "default") == 10 })
		if limitOf(h, "from-file") != 1 {
			t.Fatal("base rule missing")
		}

		// A new rule is live within 1 s.
		start := time.Now()
		put(t, cli, p+"pro", "id: pro\nmatch: {plan: pro}\nlimits: [{name: s, rate: 100, per: 1s}]\n")
		poll.True(t, time.Second, "new rule", func() bool { return limitOf(h, "pro") == 100 })
		t.Logf("put sent → snapshot updated in %v", time.Since(start))
		if m := h.Current().Match(&Attrs{APIKey: "k", Plan: "pro"}, time.Now(), nil); len(m) != 1 || m[0].Rule.ID != "pro" {
			t.Fatalf("matched %s", ids(m))
		}

		// A bad rule is refused alone; the error names the key, rule, field and line; the
		// snapshot (which never held it) is unchanged.
		before := h.Current()
		put(t, cli, p+"bad", "id: bad\nlimits:\n  - {name: s, rate: -1, per: 1s}\n")
		poll.True(t, 2*time.Second, "bad rule reported", func() bool { return rec.count() > 0 })
		st := src.Status()
		if len(st.Refused) != 1 || st.Refused[0].Key != p+"bad" || st.Refused[0].Kept ||
			!strings.Contains(st.Refused[0].Err.Error(), p+`bad:3: rule "bad": limits[0].rate: -1`) {
			t.Fatalf("refused %+v", st.Refused)
		}
		if h.Current().Version() != before.Version() || limitOf(h, "bad") != -1 {
			t.Fatal("a refused rule changed the snapshot")
		}
		// A fix makes it apply.
		put(t, cli, p+"bad", "id: bad\nlimits:\n  - {name: s, rate: 7, per: 1s}\n")
		poll.True(t, time.Second, "fixed rule", func() bool { return limitOf(h, "bad") == 7 })
		if st := src.Status(); st.LastError != nil || len(st.Refused) != 0 {
			t.Fatalf("error not cleared: %v %+v", st.LastError, st.Refused)
		}

		// Deleting a rule removes it; deleting an etcd override brings the base rule back.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Delete(ctx, p+"default"); err != nil {
			t.Fatal(err)
		}
		poll.True(t, time.Second, "base rule back", func() bool { return limitOf(h, "default") == 2 })

		// A new base (SIGHUP on the base file) is layered under the etcd rules at once.
		if err := src.SetBase(mustParse(t, "rules:\n  - id: default\n    limits: [{name: s, rate: 3, per: 1s}]\n")); err != nil {
			t.Fatal(err)
		}
		if limitOf(h, "default") != 3 || limitOf(h, "from-file") != -1 || limitOf(h, "pro") != 100 {
			t.Fatalf("after SetBase: default %v, from-file %v, pro %v", limitOf(h, "default"), limitOf(h, "from-file"), limitOf(h, "pro"))
		}
		if err := src.SetBase(&Set{Rules: []Rule{{ID: "x"}}}); err == nil || limitOf(h, "default") != 3 {
			t.Fatalf("bad base: %v", err)
		}
	})

	t.Run("compaction forces a re-list", func(t *testing.T) {
		const p = "/allot/rules/c/"
		put(t, cli, p+"r", `{"limits":[{"name":"s","rate":1,"per":"1s"}]}`)
		h := NewHolder(nil)
		rec := &errRecorder{}
		src, err := NewEtcdSource(cli, p, h, CompileOptions{}, WithOnError(rec.hook), WithInterval(200*time.Millisecond), WithLogger(testLogger(t)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := src.Load(ctx); err != nil || limitOf(h, "r") != 1 {
			t.Fatalf("Load: %v, rate %v", err, limitOf(h, "r"))
		}
		// Change the rule while nobody watches, then compact past the listed revision.
		for i := 2; i <= 5; i++ {
			put(t, cli, p+"r", `{"limits":[{"name":"s","rate":`+string(rune('0'+i))+`,"per":"1s"}]}`)
		}
		rev := put(t, cli, "/unrelated", "x")
		if _, err := cli.Compact(ctx, rev); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- src.Run(context.Background()) }()
		defer func() { src.Close(); <-done }()
		poll.True(t, 3*time.Second, "re-list after compaction", func() bool { return limitOf(h, "r") == 5 })
		put(t, cli, p+"r", `{"limits":[{"name":"s","rate":6,"per":"1s"}]}`)
		poll.True(t, time.Second, "watch after re-list", func() bool { return limitOf(h, "r") == 6 })
		if st := src.Status(); st.Revision < rev {
			t.Fatalf("revision %d, want >= %d", st.Revision, rev)
		}
	})

	t.Run("etcd down keeps the last snapshot; restart resumes watching", func(t *testing.T) {
		const p = "/allot/rules/d/"
		put(t, cli, p+"r", `{"limits":[{"name":"s","rate":1,"per":"1s"}]}`)
		h := NewHolder(nil)
		src, rec := startSource(t, cli, p, h)
		poll.True(t, 5*time.Second, "initial list", func() bool { return limitOf(h, "r") == 1 })
		good := h.Current()

		e.Members[0].Stop(t)
		poll.True(t, 5*time.Second, "outage reported", func() bool { return rec.count() > 0 && src.Status().LastError != nil })
		t.Logf("while down: %v", src.Status().LastError)
		if h.Current() != good || len(h.Current().Match(&Attrs{APIKey: "k"}, time.Now(), nil)) != 1 {
			t.Fatal("snapshot lost while etcd is down")
		}

		e.Members[0].Start(t)
		start := time.Now()
		put(t, cli, p+"r", `{"limits":[{"name":"s","rate":2,"per":"1s"}]}`)
		poll.True(t, 10*time.Second, "watch resumed", func() bool { return limitOf(h, "r") == 2 })
		t.Logf("after restart, put sent → snapshot updated in %v", time.Since(start))
		poll.True(t, 5*time.Second, "error cleared", func() bool { return src.Status().LastError == nil })
	})
}

func TestNewEtcdSourceArgs(t *testing.T) {
	h := NewHolder(nil)
	if _, err := NewEtcdSource(nil, "/p", h, CompileOptions{}); err == nil {
		t.Fatal("nil client accepted")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := NewEtcdSource(cli, "", h, CompileOptions{}); err == nil {
		t.Fatal("empty prefix accepted")
	}
	bad := &Set{Rules: []Rule{{ID: "x"}}}
	if _, err := NewEtcdSource(cli, "/p", h, CompileOptions{}, WithBase(bad)); err == nil || !strings.Contains(err.Error(), `base set: rules: rule "x": limits: missing`) {
		t.Fatalf("bad base: %v", err)
	}
	// Close before Run, and Run after Close.
	src, err := NewEtcdSource(cli, "/p", h, CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src.Close()
	if err := src.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

// testLogger routes a source's logs to t.
func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "rules", Output: t.Output(), Level: hclog.Debug})
}

// TestSetBaseBeforeEtcdAnswers: a new base given before etcd has answered (SIGHUP while
// etcd is down at start) serves at once, and a bad one changes nothing.
func TestSetBaseBeforeEtcdAnswers(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	h := NewHolder(nil)
	src, err := NewEtcdSource(cli, "/p", h, CompileOptions{}, WithBase(mustParse(t, "rules:\n  - id: default\n    limits: [{name: s, rate: 2, per: 1s}]\n")))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.SetBase(mustParse(t, "rules:\n  - id: default\n    limits: [{name: s, rate: 5, per: 1s}]\n")); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(h, "default"); got != 5 {
		t.Fatalf("after SetBase before etcd answered: default %v, want 5", got)
	}
	if err := src.SetBase(&Set{Rules: []Rule{{ID: "x"}}}); err == nil || limitOf(h, "default") != 5 {
		t.Fatalf("bad base: %v, default %v", err, limitOf(h, "default"))
	}
}

// TestEtcdBadRuleRefusedAlone (issue 28, item 4): an override written without expires_at
// (the README's etcdctl example, less a line) used to reject the whole set, so every later
// change stayed unapplied behind it. Now it is refused alone: a valid rule written after
// it applies, a good rule made bad keeps its previous version, Status lists the refused
// keys until they are fixed or deleted, and an etcd rule replacing a file rule of the same
// id is logged at warn.
func TestEtcdBadRuleRefusedAlone(t *testing.T) {
	e := testenv.Etcd(t, 1)
	cli := e.Client(t)
	const p = "/allot/rules/"
	base := mustParse(t, "rules:\n  - id: default\n    limits: [{name: s, rate: 20, per: 1s}]\n  - id: acme-launch\n    match: {api_key: k_acme}\n    expires_at: 2099-01-01T00:00:00Z\n    limits: [{name: s, rate: 100, per: 1s}]\n")
	var logs strings.Builder
	var logMu sync.Mutex
	logger := hclog.New(&hclog.LoggerOptions{Name: "rules", Level: hclog.Info, Output: lockedWriter{&logMu, &logs, t}})
	h := NewHolder(nil)
	src, _ := startSource(t, cli, p, h, WithBase(base), WithLogger(logger))
	put(t, cli, p+"pro", `{"match":{"plan":"pro"},"limits":[{"name":"s","rate":50,"per":"1s"}]}`)
	poll.True(t, 5*time.Second, "pro", func() bool { return limitOf(h, "pro") == 50 })

	// An override without expires_at: refused alone.
	put(t, cli, p+"k1", `{"match":{"api_key":"k1"},"limits":[{"name":"s","rate":500,"per":"1s"}]}`)
	poll.True(t, 2*time.Second, "k1 refused", func() bool { return len(src.Status().Refused) == 1 })
	if r := src.Status().Refused[0]; r.Key != p+"k1" || r.Kept || !strings.Contains(r.Err.Error(), "expires_at") {
		t.Fatalf("refused %+v, want k1 for its expires_at", r)
	}
	// A valid rule written after it applies (it did not, before).
	put(t, cli, p+"enterprise", `{"match":{"plan":"enterprise"},"limits":[{"name":"s","rate":900,"per":"1s"}]}`)
	poll.True(t, 2*time.Second, "a later good rule applies", func() bool { return limitOf(h, "enterprise") == 900 })
	if limitOf(h, "k1") != -1 || limitOf(h, "pro") != 50 || limitOf(h, "default") != 20 {
		t.Fatalf("k1 %v pro %v default %v", limitOf(h, "k1"), limitOf(h, "pro"), limitOf(h, "default"))
	}

	// A good rule made bad keeps its previous version.
	put(t, cli, p+"pro", `{"match":{"plan":"pro"},"limits":[{"name":"s","rate":0,"per":"1s"}]}`)
	poll.True(t, 2*time.Second, "pro refused", func() bool { return len(src.Status().Refused) == 2 })
	for _, r := range src.Status().Refused {
		if r.Key == p+"pro" && (!r.Kept || !strings.Contains(r.Err.Error(), "limits[0].rate")) {
			t.Fatalf("pro refused %+v, want its previous version kept", r)
		}
	}
	if limitOf(h, "pro") != 50 {
		t.Fatalf("pro %v, want its previous 50", limitOf(h, "pro"))
	}
	// An enforcer started now never saw pro's good version: it reads it from etcd's
	// history, so it serves what the others serve.
	h2 := NewHolder(nil)
	fresh, _ := startSource(t, cli, p, h2, WithBase(base))
	poll.True(t, 5*time.Second, "a fresh source's rules", func() bool { return limitOf(h2, "enterprise") == 900 })
	if limitOf(h2, "pro") != 50 || h2.Current().Version() != h.Current().Version() {
		t.Fatalf("fresh source: pro %v (want the previous 50 from etcd's history), version %s vs %s",
			limitOf(h2, "pro"), h2.Current().Version(), h.Current().Version())
	}
	if r := fresh.Status().Refused; len(r) != 2 {
		t.Fatalf("fresh source refused %+v, want k1 and pro", r)
	}
	// Two keys with one id: the later key (in key order) is refused.
	put(t, cli, p+"zz-dup", `{"id":"enterprise","match":{"plan":"enterprise"},"limits":[{"name":"s","rate":1,"per":"1s"}]}`)
	poll.True(t, 2*time.Second, "duplicate id refused", func() bool { return len(src.Status().Refused) == 3 })
	if limitOf(h, "enterprise") != 900 {
		t.Fatalf("enterprise %v, want the first key's 900", limitOf(h, "enterprise"))
	}

	// Fixed or deleted, nothing is refused any more.
	put(t, cli, p+"k1", `{"match":{"api_key":"k1"},"expires_at":"2099-01-01T00:00:00Z","limits":[{"name":"s","rate":500,"per":"1s"}]}`)
	put(t, cli, p+"pro", `{"match":{"plan":"pro"},"limits":[{"name":"s","rate":60,"per":"1s"}]}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cli.Delete(ctx, p+"zz-dup"); err != nil {
		t.Fatal(err)
	}
	poll.True(t, 2*time.Second, "all applied", func() bool {
		return limitOf(h, "k1") == 500 && limitOf(h, "pro") == 60 && len(src.Status().Refused) == 0
	})

	// The README's etcdctl example shadows the file's rule of the same id: it applies, and
	// says so at warn.
	put(t, cli, p+"acme-launch", `{"match":{"api_key":"k_acme"},"limits":[{"name":"second","rate":500,"per":"1s","burst":1000}],"expires_at":"2030-01-01T00:00:00Z","reason":"launch week"}`)
	poll.True(t, 2*time.Second, "etcd rule replaces the file rule", func() bool { return limitOf(h, "acme-launch") == 500 })
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	for _, want := range []string{"etcd rule replaces the file rule of the same id: key=/allot/rules/acme-launch rule=acme-launch",
		// item 9: the load line says where the rules came from (it said "from etcd" for all)
		"from-etcd=1 from-file=2 refused=0",
		"from-etcd=4 from-file=1 refused=0", // acme-launch replaced the file's
		"etcd rule refused; the other rules apply: key=/allot/rules/k1"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "etcd rule refused; the other rules apply: key=/allot/rules/k1") != 1 {
		t.Errorf("k1's refusal logged more than once per revision:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
	t  *testing.T
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return w.b.Write(p)
}
