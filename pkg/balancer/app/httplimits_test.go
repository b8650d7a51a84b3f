package app

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/pkg/appkit"
)

// The balancer's HTTP server is held to the enforcer's limits against slow clients
// (appkit's tests show them cut), with a longer Write for an admin apply's etcd write.
func TestHTTPLimitsAreTheEnforcers(t *testing.T) {
	want := appkit.DefaultHTTPLimits
	want.Write = 30 * time.Second
	if httpLimits != want {
		t.Fatalf("balancer HTTP server limits %+v, want %+v", httpLimits, want)
	}
}
