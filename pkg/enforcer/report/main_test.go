package report

import (
	"testing"

	"go.uber.org/goleak"
)

// The Reporter's goroutine, its gRPC connections and the test servers must not outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
