package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// gRPC client conns are closed by b.Cleanup; their transports may take a moment to go.
	goleak.VerifyTestMain(m,
		// Toxiproxy v2.5.0 (the stack's cross-region links, pkg/testenv.Links): when a
		// connection closes while a latency toxic holds data, the toxic's goroutine blocks
		// for good sending it to a writer that has stopped reading (toxics/latency.go:44,
		// `stub.Output <- c`). The etcd-down drill closes such connections on purpose. The
		// goroutine holds a few KiB until the test binary exits; nothing else leaks.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"),
	)
}
