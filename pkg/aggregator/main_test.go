package aggregator

import (
	"testing"

	"go.uber.org/goleak"
)

// The loops, the gRPC connections and the test servers must not outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
