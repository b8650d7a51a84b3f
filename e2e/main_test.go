package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// gRPC client conns are closed by b.Cleanup; their transports may take a moment to go.
	goleak.VerifyTestMain(m)
}
