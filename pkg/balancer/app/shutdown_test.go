package app

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	"github.com/allot-dev/allot/pkg/testenv/poll"
	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestShutdownBoundedWithEtcdGone (issue 28, item 2): a leader and a standby (the standby
// waiting in the election's Campaign) lose etcd, then are told to stop. Each must stop
// within its bound — drain_timeout for the servers plus the etcd write timeout for the
// resignation and the lease's revoke — not wait for etcd to come back. Before the fix the
// standby's Campaign, cancelled, resigned with the etcd client's own context and hung in
// that Txn until etcd answered (608 s and more in the walk-through).
func TestShutdownBoundedWithEtcdGone(t *testing.T) {
	for _, how := range []string{"stopped", "paused"} {
		t.Run(how, func(t *testing.T) {
			e := testenv.Etcd(t, 1)
			var apps []*App
			for i, id := range []string{"balancer-1", "balancer-2"} {
				cfg, err := Parse([]string{"-config", configFile, "-id", id, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
					"-etcd-endpoints", strings.Join(e.Endpoints(), ","), "-rules-file", rulesFile,
					"-interval", "1s", "-learning", "1s", "-session-ttl", "2s", "-drain-timeout", "1s", "-insecure-reports"}, env(nil), io.Discard)
				cfg.Listen.TLS = ServerTLSConfig{} // no reports are sent: the explicit opt-out, on loopback
				if err != nil {
					t.Fatal(err)
				}
				cfg.Etcd.WriteTimeout = 2 * time.Second
				a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Name: id, Level: hclog.Info, Output: testWriter{t}}))
				if err != nil {
					t.Fatal(err)
				}
				apps = append(apps, a)
				if i == 0 {
					ctx, cancel := context.WithCancel(context.Background())
					t.Cleanup(cancel)
					go a.Run(ctx) //nolint:errcheck // Close below
					poll.True(t, 10*time.Second, "the first replica leading", func() bool { ok, _ := a.Service().Leading(); return ok })
				}
			}
			// the second replica campaigns against the first's key: it stands by in Campaign
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			go apps[1].Run(ctx) //nolint:errcheck // Close below
			poll.True(t, 10*time.Second, "the standby ready", func() bool { return apps[1].Ready() == nil })
			// It waits in Campaign once its own election key stands behind the leader's.
			cli := e.Client(t)
			poll.True(t, 10*time.Second, "the standby campaigning", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				resp, err := cli.Get(ctx, apps[1].cfg.Etcd.ElectionPrefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
				return err == nil && resp.Count >= 2
			})
			// Item 7: the standby's dashboard links to the leader's, not only its report address.
			leaderDash := "http://" + apps[0].HTTPAddr() + "/dashboard/"
			poll.True(t, 5*time.Second, "the standby's dashboard linking the leader's", func() bool {
				resp, err := http.Get("http://" + apps[1].HTTPAddr() + "/dashboard/")
				if err != nil {
					return false
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return strings.Contains(string(b), `id="leader-dashboard" href="`+leaderDash+`"`)
			})

			if how == "stopped" {
				e.Members[0].Stop(t)
			} else {
				e.Members[0].Pause(t)
				t.Cleanup(func() { e.Members[0].Unpause(t) })
			}
			// bound: drain (1s) + resign/revoke (write timeout 2s) + margin for the race detector
			const bound = 8 * time.Second
			for _, a := range []*App{apps[1], apps[0]} { // the standby first: the reported trap
				began := time.Now()
				done := make(chan struct{})
				go func() { defer close(done); _ = a.Close() }()
				select {
				case <-done:
					t.Logf("%s: closed in %v with etcd %s", a.cfg.ID, time.Since(began).Round(time.Millisecond), how)
				case <-time.After(bound):
					t.Fatalf("%s: Close did not return within %v with etcd %s", a.cfg.ID, bound, how)
				}
			}
		})
	}
}
