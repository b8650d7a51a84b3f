package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/testenv"
	allotv1 "github.com/allot-dev/allot/proto/allot/v1"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Reports are authenticated (issue 27 §1): over real mutual TLS on loopback, a report
// without a client certificate, in plaintext or from another CA is refused; a us-east
// certificate claiming eu-west is refused PermissionDenied and counted; us-east's own
// report is accepted.
func TestReportsNeedTheRegionsCertificate(t *testing.T) {
	e := testenv.Etcd(t, 1)
	f := testenv.Certs(t, "", "us-east", "eu-west")
	a, _, _ := startLeader(t, e.Endpoints(), f)

	seq := uint64(0)
	report := func(c allotv1.BalancerClient, region string) (*allotv1.ReportResponse, error) {
		seq++
		now := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Report(ctx, &allotv1.ReportRequest{Region: region, EnforcerId: region + "-1", Seq: seq,
			IntervalStartMs: now.Add(-time.Second).UnixMilli(), IntervalEndMs: now.UnixMilli(),
			Usage: []*allotv1.IdentityUsage{{Rule: "default", Identity: "key:victim", Admitted: 1e6}}})
	}
	usEast := testenv.EnforcerTLS(t, f, "us-east")
	noCert := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: usEast.RootCAs}
	other := testenv.Certs(t, "", "us-east") // a CA the balancer does not trust
	otherCA := testenv.EnforcerTLS(t, other, "us-east")
	otherCA.RootCAs = usEast.RootCAs // it trusts the balancer; the balancer does not trust it
	for name, creds := range map[string]grpc.DialOption{
		"plaintext":                   grpc.WithTransportCredentials(insecure.NewCredentials()),
		"TLS without a certificate":   grpc.WithTransportCredentials(credentials.NewTLS(noCert)),
		"a certificate of another CA": grpc.WithTransportCredentials(credentials.NewTLS(otherCA)),
	} {
		if resp, err := report(reportClient(t, a.GRPCAddr(), creds), "us-east"); err == nil {
			t.Errorf("%s: %v, want the report refused", name, resp)
		}
	}
	us := reportClient(t, a.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(usEast)))
	_, err := report(us, "eu-west")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `region "us-east"'s`) {
		t.Fatalf("a us-east certificate claiming eu-west: %v, want PermissionDenied naming us-east", err)
	}
	if resp, err := report(us, "us-east"); err != nil || !resp.GetAccepted() {
		t.Fatalf("us-east's own report: %v %v, want accepted", resp, err)
	}
	if st := a.Service().Core().Stats(time.Now()); st.Regions[1].Reports != 0 {
		t.Fatalf("eu-west took %d reports, want 0", st.Regions[1].Reports)
	}
	resp, err := http.Get("http://" + a.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`allot_balancer_reports_total{region="eu-west",result="forbidden"} 1`,
		`allot_balancer_reports_total{region="us-east",result="accepted"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// Without certificates the shipped config does not start, and says what to set; the
// opt-out is explicit, loud, and loopback-only unless opted out again.
func TestReportsAuthenticatedByDefault(t *testing.T) {
	c := DefaultConfig()
	c.Regions, c.Etcd.Endpoints, c.Rules.File = []string{"us-east"}, []string{"http://127.0.0.1:1"}, rulesFile
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "client_ca_file") || !strings.Contains(err.Error(), "listen.insecure_reports") {
		t.Fatalf("the defaults without TLS: %v, want an error naming client_ca_file and listen.insecure_reports", err)
	}
	c.Listen.InsecureReports, c.Listen.GRPC = true, "0.0.0.0:9090"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "not a loopback address") {
		t.Fatalf("insecure_reports on 0.0.0.0: %v, want refused", err)
	}
	c.Listen.InsecureReportsBeyondLoopback = true
	if err := c.Validate(); err != nil {
		t.Fatalf("insecure_reports_beyond_loopback: %v", err)
	}

	args := []string{"-config", configFile, "-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0",
		"-etcd-endpoints", "http://127.0.0.1:1", "-rules-file", rulesFile, "-rules-etcd-prefix", ""}
	cfg, err := Parse(args, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen.TLS.CertFile = t.TempDir() + "/balancer.pem" // bin/certs not made
	if a, err := New(cfg, hclog.NewNullLogger()); err == nil || !strings.Contains(err.Error(), "balancer certs -dir") {
		if a != nil {
			a.Close()
		}
		t.Fatalf("the shipped config without certificates: %v, want an error naming `balancer certs`", err)
	}

	cfg, err = Parse(append(args, "-insecure-reports", "-tls=false", "-tls-cert", "", "-tls-key", "", "-tls-client-ca", ""), env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs bytes.Buffer
	a, err := New(cfg, hclog.New(&hclog.LoggerOptions{Output: lockedWriter{&mu, &logs}}))
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "[WARN]  REPORTS ARE NOT AUTHENTICATED") {
		t.Fatalf("insecure_reports logged %q, want a warning", logs.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
