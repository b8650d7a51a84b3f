package rules

import (
	"testing"

	"go.uber.org/goleak"
)

// Every source goroutine has an owner that stops and waits for it: none may outlive a test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
