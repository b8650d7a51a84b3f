package node

import (
	"testing"

	"go.uber.org/goleak"
)

// The layers' goroutines must not outlive a Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
