package rules

import (
	"testing"

	"go.uber.org/goleak"
)

func verifyNoLeaks(m *testing.M) { goleak.VerifyTestMain(m) }
